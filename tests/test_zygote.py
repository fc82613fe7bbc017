"""tests/zygote.py runs a script as a fresh `python SCRIPT ARGS` would: the same exit code, stdout, stderr, argv,
environment and folder. Each case is run both ways and compared: subprocess.run is the expected value."""

import os
import subprocess
import sys
import textwrap

import pytest

import zygote

CASES = {
    "prints": "import sys; print('out', sys.argv[1:]); print('err', file=sys.stderr)",
    "exit_3": "import sys; print('before'); sys.exit(3)",
    "exit_message": "import sys; sys.exit('a one-line error')",
    "raises": "print('partial'); raise ValueError('boom')",
    "environment": "import os; print(os.environ['ZYGOTE_TEST'], os.environ.get('PYTEST_CURRENT_TEST', '-'))",
    "folder_and_path": "import os, sys; print(os.getcwd()); print(sys.path[0]); print(__name__, __file__)",
    "atexit": "import atexit; atexit.register(lambda: print('at exit'))",
    "no_stdin": "import sys; print(repr(sys.stdin.read()))",
    "c_level_write": "import os; os.write(1, b'fd one\\n'); os.write(2, b'fd two\\n')",
}


# No GPU for these runs, so that they go through a server on a GPU machine too (zygote.run gives a run that may use
# CUDA a process of its own); and a variable of their own, so that their servers are theirs alone (the same test
# worker may hold the pages' servers).
NO_GPU = {"CUDA_VISIBLE_DEVICES": "", "ZYGOTE_TEST": "a value of these tests"}


@pytest.fixture
def servers(monkeypatch):
    monkeypatch.setattr(zygote, "PRELOAD", ["json"])  # a light server: what is compared is the run, not the imports
    # A registry of their own: counted in the pages' (MAX_SERVERS), these light servers would stop the pages' idle
    # ones, which the next page command in this worker must start again (torch's imports, 10 CPU-seconds each).
    monkeypatch.setattr(zygote, "_servers", {})
    yield
    zygote.close({**os.environ, **NO_GPU})


def served() -> int:
    """How many of these tests' servers are running: each case checks it went through one."""
    return zygote.running({**os.environ, **NO_GPU})


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_is_what_a_fresh_process_gives(case, tmp_path, servers):
    script = tmp_path / "scripts" / f"{case}.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(CASES[case]) + "\n")
    env = {**os.environ, **NO_GPU}
    cmd = [sys.executable, str(script), "one", "two words"]
    want = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    got = zygote.run(cmd, env, tmp_path, timeout=60)
    assert served() == 1
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)


def test_a_module_runs_as_python_dash_m(tmp_path, servers):
    (tmp_path / "zygote_mod.py").write_text("import sys; print(__name__, sys.argv[1:]); sys.exit(4)\n")
    cmd = [sys.executable, "-m", "zygote_mod", "x"]
    env = {**os.environ, **NO_GPU}
    want = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    got = zygote.run(cmd, env, tmp_path, timeout=60)
    assert served() == 1 and (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)
    assert want.returncode == 4 and "__main__ ['x']" in want.stdout


def test_a_run_past_its_time_is_killed_with_what_it_printed(tmp_path, servers):
    script = tmp_path / "slow.py"
    script.write_text("import subprocess, sys, time\nprint('started', flush=True)\n"
                      "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\ntime.sleep(60)\n")
    env = {**os.environ, **NO_GPU}
    with pytest.raises(subprocess.TimeoutExpired) as e:
        zygote.run([sys.executable, str(script)], env, tmp_path, timeout=1.5)
    assert e.value.output == "started\n" and served() == 1
    # the server answers the next run: the killed run's process group took its own child with it
    (tmp_path / "quick.py").write_text("print(1)\n")
    ok = zygote.run([sys.executable, str(tmp_path / "quick.py")], env, tmp_path, timeout=30)
    assert ok.returncode == 0 and ok.stdout == "1\n" and served() == 1


def test_what_is_not_a_python_script_runs_as_a_process_of_its_own():
    assert zygote.what_runs([sys.executable, "-c", "print(1)"]) is None
    assert zygote.what_runs(["uv", "run", "--frozen", "torchrun", "x.py"]) is None
    assert zygote.what_runs(["/bin/echo", "x.py"]) is None
    assert zygote.what_runs(["uv", "run", "--frozen", "a.py", "--x"]) == ("a.py", None, ["--x"])
    assert zygote.what_runs(["uv", "run", "--frozen", "python", "-m", "m", "y"]) == (None, "m", ["y"])
    assert zygote.what_runs([sys.executable, "b.py"]) == ("b.py", None, [])


def test_servers_are_bounded_and_a_busy_one_is_never_taken(tmp_path, servers, monkeypatch):
    """At most MAX_SERVERS: a run in a third environment stops the least recently used idle server; when every
    server is busy, the run gets a process of its own (and still gives the right answer)."""
    monkeypatch.setattr(zygote, "MAX_SERVERS", 2)
    (tmp_path / "env.py").write_text("import os; print(os.environ['ZYGOTE_TEST'])\n")
    cmd = [sys.executable, str(tmp_path / "env.py")]
    envs = [{**os.environ, **NO_GPU, "ZYGOTE_TEST": f"env {i}"} for i in range(3)]
    try:
        for env in envs:
            assert zygote.run(cmd, env, tmp_path, timeout=60).stdout == f"{env['ZYGOTE_TEST']}\n"
        assert [zygote.running(env) for env in envs] == [0, 1, 1]  # env 0's server, the oldest, stopped
        held = [s for pool in zygote._servers.values() for s in pool]
        for s in held:
            s.busy.acquire()
        try:
            assert zygote.run(cmd, envs[0], tmp_path, timeout=60).stdout == "env 0\n"
            assert [zygote.running(env) for env in envs] == [0, 1, 1]  # no server started or taken for it
        finally:
            for s in held:
                s.busy.release()
    finally:
        for env in envs:
            zygote.close(env)


def test_inductors_address_variable_does_not_start_another_server(tmp_path, servers):
    # A test worker's environment gains _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR at its first in-process compile.
    (tmp_path / "quick.py").write_text("print(1)\n")
    env = {**os.environ, **NO_GPU}
    env.pop("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", None)
    for run_env in (env, {**env, "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR": "140234"}):
        assert zygote.run([sys.executable, str(tmp_path / "quick.py")], run_env, tmp_path, timeout=60).stdout == "1\n"
    assert sum(len(pool) for pool in zygote._servers.values()) == 1


def test_fresh_processes_when_asked(tmp_path, servers, monkeypatch):
    monkeypatch.setenv(zygote.FRESH_VARIABLE, "1")
    (tmp_path / "quick.py").write_text("print(2)\n")
    env = {**os.environ, **NO_GPU}
    got = zygote.run([sys.executable, str(tmp_path / "quick.py")], env, tmp_path, timeout=60)
    assert got.returncode == 0 and got.stdout == "2\n" and served() == 0


def test_a_preloaded_module_that_prints_does_not_garble_the_replies(tmp_path, servers, monkeypatch):
    (tmp_path / "noisy_zygote_module.py").write_text("print('imported')\n")
    monkeypatch.setattr(zygote, "PRELOAD", ["noisy_zygote_module"])
    (tmp_path / "quick.py").write_text("print(3)\n")
    env = {**os.environ, **NO_GPU, "PYTHONPATH": str(tmp_path)}
    try:
        got = zygote.run([sys.executable, str(tmp_path / "quick.py")], env, tmp_path, timeout=60)
        assert got.returncode == 0 and got.stdout == "3\n" and zygote.running(env) == 1
    finally:
        zygote.close(env)
