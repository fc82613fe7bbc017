"""The reader on its own: reader/ builds into a wheel (`uv build`), which installs into a fresh environment without
torch, numpy or the suite, and there `torch-trace` prints, for every committed trace, what `inspect_trace.py`
prints in the suite, byte for byte (tests/data/saved_outputs.json: plain, --json, comparisons, merged ranks).

A script's guesses (--expect SCRIPT) live in the suite's scripts: alone, the reader says so in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import saved_outputs

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.subprocess

# Run in the fresh environment: every case but a script's guesses, through the installed package's command, in
# this one process; prints the names of the cases whose output differs from the saved one, as JSON.
CHILD = r"""
import contextlib, hashlib, io, json, sys
try:
    import torch  # noqa: F401
    sys.exit("torch is importable here: this environment is not the reader alone")
except ModuleNotFoundError:
    pass
import trace_reader, trace_reader.cli as cli
cases, saved, data = json.load(open(sys.argv[1]))
differ = []
for name, args in cases.items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(args, prog="inspect_trace.py")
    text = f"{code}\n{out.getvalue()}\n--stderr--\n{err.getvalue()}".replace(data, "DATA")
    if hashlib.sha256(text.encode()).hexdigest() != saved[name]:
        differ.append(name)
print(json.dumps({"differ": differ, "file": trace_reader.__file__}))
"""


def uv() -> str:
    found = shutil.which("uv") or (Path.home() / ".local/bin/uv" if (Path.home() / ".local/bin/uv").exists() else None)
    if found is None:
        pytest.skip("uv is not installed here (the GPU image has none): the wheel is built and tried where uv is")
    return str(found)


OFFLINE = ("Failed to fetch", "error sending request", "dns error", "Network is unreachable")


def ran(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """proc; a skip where uv could not reach a package index (the GPU image: no network) for what it installs."""
    if proc.returncode and any(word in proc.stderr for word in OFFLINE):
        pytest.skip("no package index reachable here: uv cannot fetch uv_build, msgspec and rich for the reader alone")
    return proc


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """(the wheel, the fresh environment's python, its bin folder)."""
    tmp = tmp_path_factory.mktemp("reader_alone")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT", "PYTHONPATH"))}
    built = ran(subprocess.run([uv(), "build", "--wheel", "--out-dir", str(tmp / "dist"), str(ROOT / "reader")],
                               capture_output=True, text=True, timeout=300, env=env))
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((tmp / "dist").glob("torch_trace-*.whl"))
    venv = tmp / "env"
    made = subprocess.run([uv(), "venv", "--python", sys.executable, str(venv)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert made.returncode == 0, made.stderr[-3000:]
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    put = ran(subprocess.run([uv(), "pip", "install", "--python", str(python), str(wheel)], capture_output=True,
                             text=True, timeout=300, env=env))
    assert put.returncode == 0, put.stderr[-3000:]
    return wheel, python, python.parent, env


def test_the_wheel_holds_the_reader_and_its_data(alone):
    wheel = alone[0]
    names = zipfile.ZipFile(wheel).namelist()
    for must in ("trace_reader/__init__.py", "trace_reader/cli.py", "trace_reader/reading/events.py",
                 "trace_reader/schemas/report.schema.json", "trace_reader/facts/torch_peaks.json"):
        assert must in names, must
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert sorted(r.split(";")[0].split("=")[0].split(">")[0].strip() for r in requires) == ["matplotlib", "msgspec", "rich"]
    assert any("extra == 'plot'" in r or 'extra == "plot"' in r for r in requires if r.startswith("matplotlib"))
    assert not any(n.startswith(("tests/", "fused_geglu", "common")) for n in names)


def test_alone_it_prints_what_the_suite_prints_for_every_committed_trace(alone, tmp_path):
    _, python, _, env = alone
    cases = {n: a for n, a in saved_outputs.cases().items() if not n.startswith(("expect ", "expect-json "))}
    assert len(cases) > 200
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps([cases, saved_outputs.saved()["printed"], str(saved_outputs.DATA)]))  # its Python is ours
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    run = subprocess.run([str(python), str(child), str(spec)], capture_output=True, text=True, timeout=600,
                         env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    said = json.loads(run.stdout)
    assert ROOT / "reader" not in Path(said["file"]).parents, "the child read the checkout, not the wheel"
    assert said["differ"] == [], f"alone, the reader prints something else for: {said['differ'][:10]}"


def test_the_console_command_and_python_m(alone, tmp_path):
    """`torch-trace TRACE` and `python -m trace_reader TRACE` are the suite's `inspect_trace.py TRACE`, byte for
    byte; a script's guesses, alone, are one line and exit 2."""
    _, python, bin_dir, env = alone
    trace = ROOT / "tests/data/h200_mlp_eager.json.gz"
    suite = subprocess.run([sys.executable, str(ROOT / "inspect_trace.py"), str(trace)], capture_output=True,
                           text=True, timeout=120)
    assert suite.returncode == 0, suite.stderr
    for argv in ([str(bin_dir / "torch-trace"), str(trace)], [str(python), "-m", "trace_reader", str(trace)]):
        got = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        assert (got.returncode, got.stdout, got.stderr) == (0, suite.stdout, ""), argv
    refused = subprocess.run([str(bin_dir / "torch-trace"), "--expect", "03_simple_mlp", str(trace)],
                             capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("torch-trace: error: --expect 03_simple_mlp: a script's guesses live in the "
                                     "suite's scripts") and refused.stderr.count("\n") == 1
    toml = ROOT / "docs/expect/03_simple_mlp_eager.toml"  # a guesses file works alone: the suite's verdicts
    own = subprocess.run([str(bin_dir / "torch-trace"), "--expect", str(toml), str(trace)], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    ref = subprocess.run([sys.executable, str(ROOT / "inspect_trace.py"), "--expect", str(toml), str(trace)],
                         capture_output=True, text=True, timeout=120)
    assert (own.returncode, own.stdout) == (ref.returncode, ref.stdout) and "Expectations" in own.stdout


def test_the_readers_readme_commands(tmp_path):
    """reader/README.md's `uvx --from ./reader torch-trace TRACE` and `uv tool install ./reader` (into a folder of
    this test's: UV_TOOL_DIR, UV_TOOL_BIN_DIR), run from the suite's checkout as the README says."""
    trace = "tests/data/h200_linear_eager.json.gz"
    suite = subprocess.run([sys.executable, "inspect_trace.py", trace], capture_output=True, text=True, timeout=120,
                           cwd=ROOT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT", "PYTHONPATH"))}
    env |= {"UV_TOOL_DIR": str(tmp_path / "tools"), "UV_TOOL_BIN_DIR": str(tmp_path / "bin")}
    once = ran(subprocess.run([uv(), "tool", "run", "--from", "./reader", "torch-trace", trace], capture_output=True,
                              text=True, timeout=300, cwd=ROOT, env=env))
    assert (once.returncode, once.stdout) == (0, suite.stdout), once.stderr[-2000:]
    put = subprocess.run([uv(), "tool", "install", "./reader"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=env)
    assert put.returncode == 0, put.stderr[-2000:]
    got = subprocess.run([str(tmp_path / "bin" / "torch-trace"), trace], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env=env)
    assert (got.returncode, got.stdout) == (0, suite.stdout)
    if (ROOT / ".git").exists():  # a git URL with the subdirectory, as from a fork: here the checkout's own commit
        url = f"git+{ROOT.as_uri()}#subdirectory=reader"
        git = subprocess.run([uv(), "tool", "run", "--from", url, "torch-trace", str(ROOT / trace)], capture_output=True, text=True,
                             timeout=300, cwd=tmp_path, env=env)
        assert (git.returncode, git.stdout) == (0, suite.stdout.replace(trace, str(ROOT / trace))), git.stderr[-2000:]
    readme = (ROOT / "reader/README.md").read_text()
    assert "uvx --from ./reader torch-trace TRACE" in readme and "uv tool install ./reader" in readme
