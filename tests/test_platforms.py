"""The suite installs and runs where readers are: Linux (x86_64, aarch64), macOS on Apple Silicon, Windows.

Two checks, both from this (Linux) machine:
- the lock resolves for every platform in pyproject's `required-environments`: `uv sync --frozen --dry-run
  --python-platform ...` into a fresh environment path, offline (the lock names every wheel), with
  Triton, Liger and CUDA only on Linux;
- the CPU scripts, the reader and the tests run with Triton made unimportable, as on macOS and Windows where
  it has no wheels: a stray top-level `import triton` fails here, not on a reader's laptop.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import zygote
from conftest import fused_cpp

ROOT = Path(__file__).resolve().parent.parent
MLP = ["--batch", "2", "--seq", "8", "--dim", "32", "--hidden", "64"]

# uv's name for each platform -> is it Linux (the only place Triton and the CUDA libraries install).
PLATFORMS = {
    "x86_64-unknown-linux-gnu": True,
    "aarch64-unknown-linux-gnu": True,
    "aarch64-apple-darwin": False,  # PyPI's torch wheels need macOS 14 (MACOSX_DEPLOYMENT_TARGET below)
    "x86_64-pc-windows-msvc": False,
}


def locked_version(name):
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (version,) = {p["version"] for p in lock["package"] if p["name"] == name}
    return version


def test_every_platform_checked_here_is_a_required_environment():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    required = " | ".join(project["tool"]["uv"]["required-environments"])
    for needle in ("'linux' and platform_machine == 'x86_64'", "'linux' and platform_machine == 'aarch64'",
                   "'darwin' and platform_machine == 'arm64'", "'win32' and platform_machine == 'AMD64'"):
        assert needle in required


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_lock_installs_on(platform, tmp_path):
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("needs uv on PATH")
    env = {**os.environ, "MACOSX_DEPLOYMENT_TARGET": "14.0", "UV_PROJECT_ENVIRONMENT": str(tmp_path / "venv")}
    # --offline: the lock names every wheel, so this needs no network (nor a warm cache).
    proc = subprocess.run([uv, "sync", "--frozen", "--dry-run", "--offline", "--python", sys.executable,
                           "--python-platform", platform], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    installs = dict(re.findall(r"^ \+ ([\w.-]+)==(\S+)$", out, flags=re.M))
    assert installs["torch"] == locked_version("torch")
    assert {"rich", "numpy", "kernels"} <= set(installs)
    linux = PLATFORMS[platform]
    assert ("triton" in installs) == linux and ("liger-kernel" in installs) == linux, sorted(installs)
    assert any(name.startswith("nvidia-") for name in installs) == linux, sorted(installs)


# Imported by every Python started with this folder on PYTHONPATH (scripts, Inductor's compile workers):
# the path finders no longer see triton or liger_kernel, so `import triton` raises ModuleNotFoundError and
# importlib.util.find_spec("triton") is None, exactly as on a Mac.
SITECUSTOMIZE = '''
import sys

HIDDEN = {"triton", "liger_kernel"}


class Hide:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attr):  # invalidate_caches and the rest: the wrapped finder's own
        return getattr(self.finder, attr)


sys.meta_path[:] = [Hide(finder) for finder in sys.meta_path]
'''


@pytest.fixture(scope="module")
def no_triton(tmp_path_factory):
    """run(*python_args, **env): a Python of this venv that cannot see Triton, Liger or a GPU."""
    site = tmp_path_factory.mktemp("no_triton")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    # No CUDA either, as on a Mac (and so also on the GPU machine, where bench.py would otherwise run).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "TRITON_INTERPRET": "0",
           "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}

    def run(*argv, **extra_env):
        # Through one zygote server of this environment (its sitecustomize hides Triton before the server imports
        # torch, as in a fresh process): the runs share its imports. Another environment gets a process of its own.
        if extra_env and any(env.get(k) != v for k, v in extra_env.items()):
            return subprocess.run([sys.executable, *argv], cwd=ROOT, env={**env, **extra_env}, capture_output=True,
                                  text=True, timeout=600)
        return zygote.run([sys.executable, *argv], env, ROOT, 600)

    yield run
    zygote.close(env)


# One process: Triton is hidden; then every script and helper imports (a stray top-level `import triton`, or
# `import fused_geglu`, fails here), the reader reports a committed H200 trace, and bench.py answers "no GPU".
IMPORT_ALL = """
import importlib, importlib.util, sys
assert importlib.util.find_spec("triton") is None and importlib.util.find_spec("liger_kernel") is None, "not hidden"
for name in MODULES:
    importlib.import_module(name)
assert "triton" not in sys.modules, "imported Triton"
print("reader exit", importlib.import_module("inspect_trace").main(["tests/data/h200_fused_eager.json.gz"]))
print("bench exit", importlib.import_module("bench").main([]))
"""


def test_every_module_imports_and_the_reader_runs_without_triton(no_triton, tmp_path):
    # Every script and helper, new ones too (the fused_geglu package, Triton's kernels, is imported after a check).
    modules = sorted(p.stem for p in ROOT.glob("*.py"))
    assert {"common", "inspect_trace", "serve_trace", "bench", "03_simple_mlp", "04_fused_mlp"} <= set(modules)
    script = tmp_path / "import_all.py"
    script.write_text(f"MODULES = {modules!r}" + IMPORT_ALL)
    proc = no_triton(str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "_geglu_tma_kernel" in proc.stdout and "reader exit 0" in proc.stdout, proc.stdout[-3000:]
    assert "bench exit 2" in proc.stdout and "CUDA" in proc.stderr


def test_compiled_mlp_runs_on_the_cpu_without_triton(no_triton, tmp_path):
    """The README's first command, as on a Mac: Inductor's C++ kernel instead of Triton's."""
    proc = no_triton("03_simple_mlp.py", *MLP, "--compile", "--device", "cpu", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wrote " in proc.stdout and "BROKEN" not in proc.stdout, proc.stdout[-3000:]
    compiled = json.loads((tmp_path / "03_simple_mlp/2x8x32x64_bf16_cold_compile.json").read_text())
    assert fused_cpp(e.get("name", "") for e in compiled["traceEvents"])


@pytest.mark.parametrize("script, interpret, instead", [
    ("03_kernels_mlp.py", "0", "tests/data/h200_liger.json.gz"),
    ("04_fused_mlp.py", "0", "tests/data/h200_fused_eager.json.gz"),
    ("04_fused_mlp.py", "1", "tests/data/h200_fused_eager.json.gz"),  # the README's interpreter command
])
def test_triton_scripts_say_so_in_one_line(no_triton, tmp_path, script, interpret, instead):
    proc = no_triton(script, *MLP, "--device", "cpu", "--out", str(tmp_path), TRITON_INTERPRET=interpret)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert "Triton" in line and "Linux" in line and "uv run 03_simple_mlp.py --compile" in line, line
    assert (ROOT / instead).exists() and f"uv run inspect_trace.py {instead}" in line, line
    assert not list(tmp_path.rglob("*.json"))


def test_tests_that_need_triton_skip_with_the_reason(no_triton):
    # -n 0: in this one process, not pyproject's workers (each would import torch again to skip three tests)
    proc = no_triton("-m", "pytest", "-q", "-rs", "-n", "0", "-p", "no:cacheprovider", "tests/test_fused_geglu.py",
                     "tests/test_scripts.py::test_fused_mlp_in_the_triton_interpreter",
                     "tests/test_scripts.py::test_hub_wait_is_bounded")
    assert proc.returncode == 0, proc.stdout[-3000:]
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 3 and all("needs Triton" in line for line in skipped), proc.stdout[-3000:]
    assert " passed" not in proc.stdout and "3 skipped" in proc.stdout
