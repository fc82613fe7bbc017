"""What keeps a script's output whole and its failures to one line; the scripts reach it through common.py.

- the Ctrl-C handler while torch imports, in place as soon as this file is imported (common.py imports it first)
- `Fail`            bad input or an impossible run: one line on stderr, exit code 2
- `looks_complete()` whether the profiler wrote the whole trace
- `land_pair()`     the new trace and table moved into place together, a Ctrl-C held until both are
- `main()`          runs a script's main(): Fail, out of memory, Ctrl-C and a standard output that cannot be written
                    each become one line and an exit code, never a traceback; a failed run's empty folders go

It imports no torch at the top (only main() asks torch for its out-of-memory error), so that its handler is in
place before the slow import starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
from pathlib import Path


def interrupted_while_starting(signum, frame):
    # Ctrl-C while Python imports torch (the first seconds): nothing has been written yet. Exit at once, so
    # no library's import machinery can turn the KeyboardInterrupt into a traceback or swallow it.
    _say(f"{Path(sys.argv[0]).name}: interrupted before writing; earlier traces are untouched")
    os._exit(130)


def _say(line: str) -> None:
    """One line on standard error in one write: print() writes the text and its newline apart, and under torchrun
    two ranks failing at once then interleave into 'error: ...error: ...' on one line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# Scripts import common (which imports this file first) before torch, so this handler is in place before the slow
# imports start; main() swaps it for the usual KeyboardInterrupt. Only when one of this suite's scripts is the
# program and torch is not loaded yet: an importer (pytest, a notebook, bench.py) keeps its own Ctrl-C.
_main_file = getattr(sys.modules.get("__main__"), "__file__", None)
if _main_file and Path(_main_file).resolve().parent == Path(__file__).resolve().parent and "torch" not in sys.modules:
    signal.signal(signal.SIGINT, interrupted_while_starting)


class Fail(Exception):
    """Bad input or an impossible run: reported as one line, exit code 2."""


written: Path | None = None  # the trace land_pair() put in place in this process: what a later Ctrl-C must not deny
made_folders: list[Path] = []  # output folders common.setup() made: removed again if the run fails and they are empty


def looks_complete(path: Path) -> bool:
    """A Chrome trace is one JSON object: a missing, empty or cut-off file does not end with '}'."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 64))
            return f.read().rstrip().endswith(b"}")
    except FileNotFoundError:
        return False


def land_pair(tmp: Path, new_table: Path, table: Path, new_trace: Path, trace: Path) -> None:
    """Move the new table and trace (in the temporary folder `tmp`) onto `table` and `trace`, and remember the trace
    as written; a Ctrl-C between the two moves would split the pair, so it waits until both are done."""
    global written
    with _ctrl_c_deferred():
        _replace_pair(tmp, new_table, table, new_trace, trace)
        written = trace


def _replace_pair(tmp: Path, new_table: Path, table: Path, new_trace: Path, trace: Path) -> None:
    """Move both new files into place; if the trace cannot follow the table, put the old table back."""
    old_table = tmp / "old.txt"
    if table.is_file():
        try:
            os.link(table, old_table)  # a second name for the old bytes, to restore them
        except OSError:
            shutil.copy2(table, old_table)
    os.replace(new_table, table)  # os.replace is atomic: the old file or the new one, never half of one
    try:
        os.replace(new_trace, trace)
    except OSError:
        if old_table.exists():
            os.replace(old_table, table)
        else:
            table.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _ctrl_c_deferred():
    """Hold a Ctrl-C until the block is done, then raise it (Python runs signal handlers in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            raise KeyboardInterrupt


def main(fn) -> None:
    """Run a script's main(); bad input and known failures become one line on stderr, never a traceback."""
    import torch  # for its OutOfMemoryError; loaded already, by common.py

    prog = Path(sys.argv[0]).name
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on Ctrl-C is a KeyboardInterrupt
    stdout, sys.stdout = sys.stdout, _GuardedStdout(sys.stdout)
    try:
        code = fn()
        sys.stdout.flush()  # a full disk or a closed pipe on stdout shows here, not at exit
    except Fail as e:
        code = _fail(prog, str(e))
    except torch.OutOfMemoryError:
        code = _fail(prog, "out of memory at this shape; try smaller sizes" + _wrote_or_not())
    except RuntimeError as e:  # a failed allocation on the CPU
        if "allocate" not in str(e) and "out of memory" not in str(e):
            raise
        code = _fail(prog, "out of memory at this shape; try smaller sizes" + _wrote_or_not())
    except KeyboardInterrupt:
        _remove_made_folders()
        where = f"after writing {written}" if written else "before writing; earlier traces are untouched"
        _say(f"{prog}: interrupted {where}")
        code = 130
    except _StdoutError as e:
        try:  # what is still buffered goes nowhere, also when Python flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())
        except (OSError, ValueError):
            pass
        code = _fail(prog, f"cannot write the report to standard output: {e.args[0].strerror or e.args[0]}" +
                     (f" (the trace was written: {written})" if written else ""))
    finally:
        sys.stdout = stdout
    sys.exit(code or 0)


class _StdoutError(Exception):
    """Writing to standard output failed (a full disk, a closed pipe): args[0] is the OSError."""


class _GuardedStdout:
    """sys.stdout whose failed writes raise _StdoutError, so main() can tell them from other OSErrors."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as e:
            raise _StdoutError(e) from None

    def flush(self):
        try:
            self._stream.flush()
        except OSError as e:
            raise _StdoutError(e) from None

    def __getattr__(self, name):  # isatty, fileno, encoding, ...: the real stream's
        return getattr(self._stream, name)


def _wrote_or_not() -> str:
    return f" (the trace was written: {written})" if written else " (nothing was written)"


def _fail(prog: str, message: str) -> int:
    _remove_made_folders()
    _say(f"{prog}: error: {message}")
    return 2


def _remove_made_folders() -> None:
    """A failed run leaves no empty output folders behind (folders with files in them stay)."""
    for folder in reversed(made_folders):
        try:
            folder.rmdir()
        except OSError:
            pass
