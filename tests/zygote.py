"""`python SCRIPT ARGS`, run in a child forked from a Python that has imported torch (and Dynamo, Inductor,
transformers, matplotlib) already: the same run as a fresh process, without its imports, 3 to 20 CPU-seconds each
on the suite's 2-core machines (the pages' commands are about 70 runs).

One server per environment: a server is started with the environment of the runs it serves, so whatever torch or
a library reads from the environment when it is imported (OMP_NUM_THREADS, TRITON_INTERPRET, HF_HUB_OFFLINE, ...)
is what a fresh process with that environment would read. The child gets the command's argv, sys.path[0] (the
script's folder), a current folder, stdin from /dev/null and stdout/stderr to files; it exits as Python would: the
script's SystemExit code, 1 after a traceback on stderr, atexit handlers run first. Nothing of torch runs in the
server before it forks (no thread pool, no CUDA), so the fork is safe.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PRELOAD = ["torch", "torch._dynamo", "torch._inductor.compile_fx", "transformers", "matplotlib.pyplot"]

SERVER = r"""
import importlib, json, os, runpy, signal, sys, time
requests, replies = sys.stdin, sys.stdout
sys.stdout = sys.stderr  # nothing an import prints may land in the replies
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception:  # not installed here: the child imports what it needs itself
        pass

def child(req):
    os.setsid()  # its own process group: a timeout kills what it started too
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False, errors="backslashreplace")
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    code = 0
    try:
        if req["module"]:
            sys.argv = [req["module"], *req["args"]]
            sys.path[0] = os.getcwd()
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [req["script"], *req["args"]]
            sys.path[0] = os.path.dirname(os.path.abspath(req["script"]))
            runpy.run_path(req["script"], run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException as e:
        import traceback
        tb = e.__traceback__  # from the script's own frames on, as Python prints it: not this server's, not runpy's
        while tb is not None and tb.tb_frame.f_code.co_filename in ("<string>", "<frozen runpy>", runpy.__file__):
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        code = 1
    try:
        import atexit
        atexit._run_exitfuncs()
    finally:
        for f in (sys.stdout, sys.stderr, sys.__stderr__):
            try:
                f.flush()
            except Exception:
                pass
        os._exit(code & 0xFF)

for line in requests:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(req)
    deadline, status = time.monotonic() + req["timeout"], None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(st)
        elif time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = "timeout"
        else:
            time.sleep(0.02)
    replies.write(json.dumps({"code": status}) + "\n")
    replies.flush()
"""


class _Server:
    def __init__(self, env: dict):
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(PRELOAD)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        self.busy = threading.Lock()
        self.used = time.monotonic()

    def run(self, req: dict):
        """The child's exit status (or "timeout"); the caller holds self.busy."""
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the zygote server died")
        return json.loads(line)["code"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_servers: dict[str, list[_Server]] = {}
_servers_lock = threading.Lock()


# A server serves the runs whose environments differ from its own in these only (the child gets the run's own): set
# by pytest for each test, or read only when CUDA starts, which never happens in a server (runs that may see a GPU
# get a process of their own, so where there is one every server has CUDA_VISIBLE_DEVICES="").
# Also _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR: Inductor writes an address of its own process there before it loads a
# compiled kernel (every process sets its own first), so a test worker's environment gains it at its first in-process
# compile, and every later run would start a new server (torch's imports, about 10 CPU-seconds).
VOLATILE = {"PYTEST_CURRENT_TEST", "CUDA_VISIBLE_DEVICES", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"}
# A server holds about 0.9 GB (torch, Dynamo, Inductor, transformers): at most this many per test process. Past it,
# the least recently used idle one stops; if none is idle, the run gets a process of its own.
MAX_SERVERS = 2
# Set to 1, every run gets a process of its own, as before this module (a machine short of memory: the pages' tests
# peak at about 3.5 GB above an idle 2-core machine's with the servers).
FRESH_VARIABLE = "TESTS_FRESH_PROCESSES"


def _key(env: dict) -> str:
    return json.dumps(sorted((k, v) for k, v in env.items() if k not in VOLATILE))


def _idle_server(env: dict) -> _Server | None:
    """A server of this environment that no other thread is using (its `busy` lock taken), a new one if none is and
    MAX_SERVERS allows (stopping the least recently used idle one if need be); None if every server is busy."""
    env, key = {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}, _key(env)
    with _servers_lock:
        for k in list(_servers):
            _servers[k] = [s for s in _servers[k] if s.proc.poll() is None]
        for s in _servers.setdefault(key, []):
            if s.busy.acquire(blocking=False):
                s.used = time.monotonic()
                return s
        every = [s for pool in _servers.values() for s in pool]
        if len(every) >= MAX_SERVERS:
            idle = [s for s in sorted(every, key=lambda s: s.used) if s.busy.acquire(blocking=False)]
            if not idle:
                return None
            for s in idle[1:]:
                s.busy.release()
            idle[0].close()
            for pool in _servers.values():
                if idle[0] in pool:
                    pool.remove(idle[0])
        s = _Server(env)
        s.busy.acquire()
        _servers[key].append(s)
        return s


def running(env: dict) -> int:
    """How many servers of this environment are running."""
    with _servers_lock:
        return sum(s.proc.poll() is None for s in _servers.get(_key(env), []))


def close(env: dict | None = None) -> None:
    """Stop the servers of this environment, or all."""
    with _servers_lock:
        for key in [_key(env)] if env is not None else list(_servers):
            for s in _servers.pop(key, []):
                s.close()


def what_runs(cmd: list[str]) -> tuple[str | None, str | None, list[str]] | None:
    """(script, module, args) of `python SCRIPT ARGS` or `python -m MODULE ARGS` with this interpreter (or
    `uv run --frozen SCRIPT.py ARGS`, this interpreter's project); None for anything else."""
    start = 3 if len(cmd) > 3 and Path(cmd[0]).name == "uv" and cmd[1:3] == ["run", "--frozen"] else \
        1 if cmd and cmd[0] == sys.executable else None
    if start is None or len(cmd) <= start:
        return None
    rest = cmd[start:]
    if start == 3 and rest[0] == "python":
        rest = rest[1:]
    elif start == 3 and not rest[0].endswith(".py"):
        return None  # a console script (torchrun, pytest): a process of its own
    if rest and rest[0] == "-m" and len(rest) > 1:
        return None, rest[1], rest[2:]
    if rest and rest[0].endswith(".py"):
        return rest[0], None, rest[1:]
    return None


def _may_see_a_gpu(env: dict) -> bool:
    """A run that may use CUDA gets a process of its own: CUDA does not survive a fork once a parent has touched it."""
    if env.get("CUDA_VISIBLE_DEVICES") == "":
        return False
    import torch

    return torch.cuda.is_available()


def run(cmd: list[str], env: dict, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout), through a server
    where `cmd` is a Python script or module (what_runs) on the CPU, else as a process of its own."""
    what = what_runs(cmd)
    fresh = what is None or os.environ.get(FRESH_VARIABLE) == "1" or _may_see_a_gpu(env)
    server = None if fresh else _idle_server(env)
    if server is None:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)
    script, module, args = what
    with tempfile.TemporaryDirectory(prefix="zygote-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        try:
            code = server.run({"script": script, "module": module, "args": args, "cwd": str(cwd), "env": env,
                               "stdout": str(out), "stderr": str(err), "timeout": timeout})
        finally:
            server.busy.release()
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
    if code == "timeout":
        raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr)
    return subprocess.CompletedProcess(cmd, code, stdout, stderr)

