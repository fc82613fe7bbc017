"""Plumbing shared by the scripts: flags, device and dtype, the profiler loop, export.

The model and the profiled step live in each script, where the reader looks for them.
This file only holds what every script does the same way:

- `parser()`        one argparse CLI: the script's sizes plus --compile --dtype --warmup ...
- `setup()`         device, dtype, output folder, checked before any work starts
- `profile()`       Part 1's loop: schedule(wait=1, warmup=1, active=3, repeat=1), step(); prof.step(), no per-step sync
- `export()`        the Chrome trace (.json / .json.gz) and the profiler table (.txt), written atomically
- `show()`          print the paths, how to open them, the trace read back and the post's expectations
- `record()`        profile + export + show: the last line of every script
- `main()`          turns bad input into one clear line and a non-zero exit (safe_output.py's, with `Fail`)

and, for the scripts torchrun starts once per rank (08, 09): `rank_report()` here, and from torchrun_harness.py
`torchrun_rank()` (the launch checked before any rank waits for another), `whole_lines()` and `start_ranks()`.
The scripts call every one of them as common.<name>.
"""

from __future__ import annotations

import safe_output  # first: its Ctrl-C handler must be in place before torch's slow import

import argparse
import contextlib
import errno
import gzip
import logging
import os
import re
import shlex
import shutil
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path


class DropMessage(logging.Filter):
    """Drop one known, harmless log message; every other record passes."""

    def __init__(self, pattern: str):
        super().__init__()
        self.rx = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.rx.search(record.getMessage())


# A CUDA build of torch on a machine without a GPU warns at Inductor's first compile that it found a CUDA
# toolkit but no runtime. Nothing here needs one; the filter must be in place before torch imports the module.
logging.getLogger("torch.utils.cpp_extension").addFilter(DropMessage(r"^No CUDA runtime is found"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function, schedule  # noqa: E402

import inspect_trace  # noqa: E402
from trace_reader.render.plot import CPU_HAS_NO_ROOFLINE, plot_next_to  # noqa: E402 - imports matplotlib only when it draws
from trace_reader.reading.events import plural  # noqa: E402,F401 - the scripts' "1 layer", "2 layers"

# Re-exported: the scripts call these as common.<name>. Fail and main() live in safe_output.py (output kept whole,
# failures in one line); the plumbing of a process torchrun started, in torchrun_harness.py.
from safe_output import Fail, main  # noqa: E402,F401
from torchrun_harness import TORCHRUN_ENV, start_ranks, torchrun_rank, whole_lines  # noqa: E402,F401


class Profiler(profile):
    """torch.profiler.profile, without importing Inductor into a process that never compiled. Each time the schedule
    starts a cycle, torch's profile asks `hasattr(torch, "_inductor")` to read Inductor's CUDA-graphs setting, and
    that lookup imports Inductor (and Dynamo): about 2 s of CPU for an eager run. Where Inductor is not imported yet,
    nothing in this process compiled and its setting is still its default (off), as profile starts it; the lookup
    then finds no such module."""

    def prepare_trace(self):
        lazy = getattr(torch, "_lazy_modules", None)
        if "torch._inductor" in sys.modules or not isinstance(lazy, set) or "_inductor" not in lazy:
            return super().prepare_trace()
        lazy.discard("_inductor")
        try:
            return super().prepare_trace()
        finally:
            lazy.add("_inductor")


ROOT = Path(__file__).resolve().parent
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MAX_DIM = 1 << 20  # a single size above a million is a typo, not an experiment
MAX_ACTIVE = 1000
SCHEDULE = {"wait": 1, "profiler_warmup": 1, "active": 3}  # the post's schedule(wait=1, warmup=1, active=3)
WARMUP_CALLS = 3  # a bare --warmup: enough calls for cuBLAS heuristics, lazy loading and compilation to be done


class FlagParser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints usage + error; one line is enough
        raise Fail(message)

    def parse_known_args(self, args=None, namespace=None):
        """Flags in either spelling: the posts write --in_dim, the suite's own flags --kv-heads; a user's guess of the
        other one (--in-dim, --kv_heads) is the same flag. --help shows each flag once, as it is declared."""
        args = list(sys.argv[1:] if args is None else args)
        for i, arg in enumerate(args):
            if arg == "--":
                break
            name, eq, value = arg.partition("=")
            if not name.startswith("--") or name in self._option_string_actions:
                continue
            other = "--" + (name[2:].replace("_", "-") if "_" in name else name[2:].replace("-", "_"))
            if other in self._option_string_actions:
                args[i] = other + eq + value
        return super().parse_known_args(args, namespace)


def int_arg(low: int, high: int):
    """An argparse type: a whole number in [low, high], with a one-line complaint otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


size_arg = int_arg(1, MAX_DIM)


def float_arg(low: float, high: float):
    """An argparse type: a number in (low, high], with a one-line complaint otherwise (nan and inf are not numbers)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not low < value <= high:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be above {low:g} and at most {high:g}, got {text}")
        return value

    return parse


def folder_arg(text: str) -> Path:
    """An argparse type: a folder path; an empty one (`--out ""`, an unset shell variable) would mean the current
    folder without saying so, and is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; name a folder (--out . for the current one)")
    return Path(text)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's default once: not where its help says it already ("default: the config's"), not "None"."""

    def _get_help_string(self, action):
        if action.default is None or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def parser(doc: str, on_cpu: str | None = None, post_sizes: bool = True, **sizes: int) -> argparse.ArgumentParser:
    """The CLI every script shares; `sizes` are the script's own flags with their defaults, the post's where
    `post_sizes` (05's and 06's are not: the posts have no attention block or whole model).

    `on_cpu`: what a run on a machine without a CUDA GPU does, shown at the end of --help."""
    p = FlagParser(description=doc.strip().splitlines()[0], epilog=on_cpu and f"On a CPU: {on_cpu}",
                formatter_class=_HelpFormatter)
    for name, default in sizes.items():
        p.add_argument(f"--{name}", type=size_arg, default=default,
                       help=f"{name} (the post uses {default})" if post_sizes else name)
    p.add_argument("--compile", action="store_true", help="torch.compile the forward")
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16", help="parameter and input dtype")
    p.add_argument("--warmup", type=int_arg(0, 10_000), nargs="?", const=WARMUP_CALLS, default=0, metavar="N",
                   help=f"a warm run: call the forward N times before profiling (bare --warmup: {WARMUP_CALLS}, "
                        "as in the post's `--warmup`); 0 = a cold run")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto = CUDA when available, else the CPU")
    p.add_argument("--wait", type=int_arg(0, MAX_ACTIVE), default=SCHEDULE["wait"], metavar="N",
                   help="profiler schedule: steps run without the profiler first (Part 1: wait=1, and wait=0 to see "
                        "the Activity Buffer Request)")
    p.add_argument("--profiler-warmup", type=int_arg(0, MAX_ACTIVE), default=SCHEDULE["profiler_warmup"], metavar="N",
                   help="profiler schedule: steps traced and thrown away before the active ones (Part 1: 1, and 0)")
    p.add_argument("--active", type=int_arg(1, MAX_ACTIVE), default=SCHEDULE["active"], metavar="N",
                   help="profiler schedule: steps kept in the trace (Part 1: 3, and 20 to see kernel times vary)")
    p.add_argument("--sync-each-step", action="store_true",
                   help="torch.cuda.synchronize() after every step; by default, as in the post, the profiler syncs once "
                        "at the end and the CPU runs ahead of the GPU")
    p.add_argument("--out", type=folder_arg, default=ROOT / "traces", help="output folder (one sub-folder per script)")
    p.add_argument("--gzip", action="store_true", help="write the trace as .json.gz (smaller; for long --active runs)")
    p.add_argument("--open", action="store_true", help="serve the new trace to ui.perfetto.dev from 127.0.0.1 and open it")
    p.add_argument("--port", type=int_arg(0, 65535), default=9001, help="port for --open (ui.perfetto.dev fetches from 9001 only)")
    p.add_argument("--plot", action="store_true",
                   help="also draw the roofline next to the trace (<stem>.png); GPU runs only: a CPU run has no roofline")
    return p


@dataclass
class Run:
    """What setup() resolved: everything the profiler loop and the export need."""

    script: str
    args: argparse.Namespace
    device: torch.device
    dtype: torch.dtype
    compiled: bool = False  # the script compiles part of its model even without --compile (FlexAttention)
    rank: int | None = None  # one process of a distributed run: its files end in _rank<N>

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def mode(self) -> str:
        return "compile" if self.args.compile or self.compiled else "eager"

    def stem(self, shape: str, flags: str = "") -> str:
        """{shape}_{dtype}_{cold|warm}{schedule, sync}{flags}_{mode}: every flag that changes the trace is in the
        name, so no two runs overwrite each other; a default run keeps the post's name (64_bf16_cold_eager).

        The schedule and --sync-each-step appear only when not the post's (_wait0, _pwarmup0, _active20, _sync);
        `flags` are the script's own, already written as tags (01_matmul_add's --batched 4: "_bmm4"). A rank of a
        distributed run ends its name with _rank<N>, so the ranks of one run share the rest of it."""
        a = self.args
        temp = "warm" if a.warmup else "cold"
        tags = {"wait": "wait", "profiler_warmup": "pwarmup", "active": "active"}
        schedule = "".join(f"_{tag}{getattr(a, key)}" for key, tag in tags.items() if getattr(a, key) != SCHEDULE[key])
        rank = "" if self.rank is None else f"_rank{self.rank}"
        return f"{shape}_{a.dtype}_{temp}{schedule}{'_sync' if a.sync_each_step else ''}{flags}_{self.mode}{rank}"


def setup(script_file: str, args: argparse.Namespace, elements: int = 0, compiled: bool = False) -> Run:
    """Resolve device and dtype and check the run can succeed before any work starts.

    `elements`: about how many tensor elements the run holds at once (weights + activations),
    so an impossible shape fails here in one line instead of deep inside an allocation.
    `compiled`: the script compiles part of its model whatever the flags (FlexAttention): named `_compile`.
    """
    if args.device == "cuda" and not torch.cuda.is_available():
        raise Fail("--device cuda, but this machine has no CUDA GPU that PyTorch can use; try --device cpu")
    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    if getattr(args, "plot", False) and device.type != "cuda":  # as inspect_trace.py --plot says of a CPU trace
        raise Fail(f"--plot on the CPU: {CPU_HAS_NO_ROOFLINE}; run without --plot")
    need_bytes = elements * DTYPES[args.dtype].itemsize
    if need_bytes:
        free = free_bytes(device)
        if free is not None and need_bytes > 0.9 * free:
            raise Fail(f"this shape needs about {need_bytes / 2**30:.1f} GiB but the {device.type} has "
                       f"{free / 2**30:.1f} GiB free; try smaller sizes")
    out = args.out / Path(script_file).stem
    try:
        # removed again if the run fails
        safe_output.made_folders.extend(p for p in reversed([out, *out.parents]) if not p.exists())
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()  # fail now, not after the run
    except OSError as e:
        raise Fail(f"cannot write to output folder {out}: {e.strerror or e}") from None
    args.out = out
    if getattr(args, "open", False):  # a busy port is reported now, not after the whole run
        from trace_reader import serve as serve_trace

        try:
            serve_trace.check_port(args.port)
        except serve_trace.ServeError as e:
            raise Fail(str(e)) from None
    if (args.compile or compiled) and device.type == "cpu":
        check_cpp_compiler()
        # Name each C++ kernel Inductor generates in the trace: the CPU twin of the post's Triton kernel.
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    return Run(Path(script_file).stem, args, device, DTYPES[args.dtype], compiled)


def check_cpp_compiler() -> None:
    """torch.compile on the CPU builds C++ kernels: without a compiler it fails deep inside Inductor, after the model is built."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        from torch._inductor.exc import InvalidCxxCompiler
    except ImportError:  # another torch layout: let Inductor report it
        return
    try:
        get_cpp_compiler()
    except (InvalidCxxCompiler, RuntimeError):  # RuntimeError: Windows's check for cl.exe
        cxx = os.environ.get("CXX") or {"darwin": "clang++", "win32": "cl"}.get(sys.platform, "g++")
        how = {"darwin": "xcode-select --install",
               "win32": "Visual Studio's Desktop development with C++, from its developer prompt"}.get(
                   sys.platform, "e.g. apt install g++")
        raise Fail(f"--compile on the CPU needs a C++ compiler and {cxx!r} is not one that runs here; install one "
                   f"({how}; or set CXX to a working compiler) or run without --compile") from None


def free_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # Windows has no os.sysconf; macOS lacks SC_AVPHYS_PAGES
        return None


def sync(run: Run) -> None:
    if run.cuda:
        torch.cuda.synchronize()  # kernels launch asynchronously; wait so timing and traces are complete


def describe(run: Run) -> None:
    a = run.args
    name = torch.cuda.get_device_name(run.device) if run.cuda else "CPU"
    print(f"{run.script}: {name}, torch {torch.__version__}, {a.dtype}, {run.mode}, "
          f"{f'warm ({a.warmup} calls)' if a.warmup else 'cold'}, "
          f"schedule(wait={a.wait}, warmup={a.profiler_warmup}, active={a.active}), "
          f"{'sync after each step' if a.sync_each_step else 'no per-step sync'}")


# kineto writes these straight to file descriptor 2 at every profiler start and stop; without a GPU it also
# reports that it found none. Any other line it writes (a real error) still reaches the reader.
_KINETO_NOISE = re.compile(rb"^USDT:.*\] profiler_(start|stop)\s*$")
_KINETO_NO_GPU = re.compile(rb"^ERROR:.*\] gpuGetDeviceCount failed")
# On a full disk the exporter logs this instead of raising; export() then says so in its one line.
_KINETO_WRITE_FAILED = re.compile(rb"^ERROR:.*\] Failed to write to log file!")


@contextlib.contextmanager
def _quiet_kineto(*also: re.Pattern):
    """Hold stderr in a temp file while the profiler runs, then pass on every line but kineto's noise (and `also`)."""
    sys.stderr.flush()
    saved = os.dup(2)
    held = tempfile.TemporaryFile()
    os.dup2(held.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        held.seek(0)
        no_gpu = not torch.cuda.is_available()
        for line in held:
            if not (_KINETO_NOISE.match(line) or (no_gpu and _KINETO_NO_GPU.match(line))
                    or any(p.match(line) for p in also)):
                os.write(2, line)
        held.close()


def profile(run: Run, step, annotation: str, profile_memory: bool = False, with_stack: bool = False) -> Profiler:
    """Part 1's harness: optional warm-up calls, then the post's loop under schedule(wait, warmup, active).

    The loop is the post's: `step(); prof.step()`, no synchronize in between, so the CPU may run ahead of the
    GPU (the lag Part 1 shows between the lanes); the profiler synchronizes once, when the active window ends.
    `profile_memory` adds the allocator's "[memory]" events (each allocation and free, with the running total);
    `with_stack` the Python calls, which torch's memory profiler needs to tell parameters and optimizer state apart.
    """
    a = run.args
    if a.compile:
        print(f"compiling the forward with torch.compile: the first call takes a while{' on a CPU' if not run.cuda else ''} "
              "(tens of seconds)", flush=True)
    for _ in range(a.warmup):
        step()  # warm calls pay compilation, cuBLAS heuristics and allocator growth outside the trace
    sync(run)
    # We export once, after the last active step, so the "events are cleared each cycle" warning does not apply.
    warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle.*")
    # --profiler-warmup 0 is Part 1's experiment, asked for on purpose: no need to warn about it.
    warnings.filterwarnings("ignore", message=".*Profiler won't be using warmup.*")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.cuda else [])
    interrupted = False
    try:
        with _quiet_kineto(), Profiler(
            activities=activities,
            schedule=schedule(wait=a.wait, warmup=a.profiler_warmup, active=a.active, repeat=1),  # the post's
            record_shapes=True,  # input shapes let the trace reader compute FLOP/s and bytes
            profile_memory=profile_memory,
            with_stack=with_stack,
        ) as prof:
            try:
                for _ in range(a.wait + a.profiler_warmup + a.active):
                    with record_function(annotation):
                        step()
                    if a.sync_each_step:
                        sync(run)
                    prof.step()
            except KeyboardInterrupt:
                interrupted = True
                raise
    except Exception:
        if interrupted:  # Ctrl-C mid-step can leave the profiler unable to stop cleanly; report the Ctrl-C
            raise KeyboardInterrupt from None
        raise
    return prof


def export(run: Run, prof: Profiler, shape: str, flags: str = "") -> tuple[Path, Path]:
    """Write <out>/<stem>.json[.gz] and <stem>.txt as a pair (Run.stem), both new files landing or neither.

    Both are written into a temporary folder beside them, then moved into place; if the second move fails
    the old table is put back. Any failure is one line (Fail), with the previous pair untouched.
    """
    stem = run.stem(shape, flags)
    out = run.args.out
    trace = out / (stem + (".json.gz" if run.args.gzip else ".json"))
    table = out / (stem + ".txt")
    sort_by = "cuda_time_total" if run.cuda else "cpu_time_total"
    tmp = None
    try:
        # Made again if gone: another run into the same folder that failed removes the folder it made, if empty
        # (safe_output's main()), even while this run still profiles
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out))
        raw = tmp / "trace.json"
        with _quiet_kineto(_KINETO_WRITE_FAILED):
            prof.export_chrome_trace(str(raw))
        if not safe_output.looks_complete(raw):  # the profiler logs a write error (a full disk) instead of raising
            raise OSError(errno.EIO, "the profiler could not write the trace (is the disk full?)")
        if run.args.gzip:
            with open(raw, "rb") as src, gzip.open(tmp / "trace.json.gz", "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            raw.unlink()
            raw = tmp / "trace.json.gz"
        (tmp / "table.txt").write_text(prof.key_averages().table(sort_by=sort_by, row_limit=40) + "\n")
        safe_output.land_pair(tmp, tmp / "table.txt", table, raw, trace)  # both or neither; a Ctrl-C waits
    except OSError as e:
        detail = e.strerror or str(e)
        if trace.is_dir() or table.is_dir():  # os.replace onto a folder: IsADirectoryError, PermissionError on Windows
            detail = f"{trace.name if trace.is_dir() else table.name} is a folder"
        raise Fail(f"could not write {trace.name} and {table.name} in {out}: {detail}; "
                   "the previous files are untouched") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return trace, table


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in fp32: one number for 'do these two outputs agree'."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


# bf16 keeps 8 bits of mantissa; two implementations of the same MLP differ by a few 1e-3.
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def check_close(run: Run, name: str, out: torch.Tensor, expected: torch.Tensor,
                reference: str = "eager SimpleGeGLUMLP") -> float:
    """Correct before fast: `out` must match `expected` (what `reference` computed) to the dtype's tolerance."""
    err = rel_error(out, expected)
    tol = TOLERANCE[run.dtype]
    print(f"check: {name} vs {reference}, relative error {err:.2e} (tolerance {tol:.0e})")
    if not err <= tol:  # also catches NaN
        raise Fail(f"{name}'s output differs from the {reference}: relative error {err:.2e} > {tol:.0e}")
    return err


def check_same_output(run: Run, name: str, model, reference, x: torch.Tensor) -> float:
    """Correct before fast: `model` and `reference`, given the same weights, must agree on x."""
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        return check_close(run, name, model(x), reference(x))


def typed(path: Path) -> str:
    """A path as the reader types it where they stand: relative under the current folder, else absolute; quoted
    for the shell when it needs quoting."""
    p = Path(path).resolve()
    here = Path.cwd()
    return shlex.quote(str(p.relative_to(here)) if p.is_relative_to(here) else str(p))


def uv_run(script: str, *args) -> str:
    """`uv run SCRIPT ARGS` as the reader can paste it where they stand: the suite's script and every Path typed
    for the current folder (uv finds the project from the script's own folder)."""
    return " ".join(["uv run", typed(ROOT / script), *(typed(a) if isinstance(a, Path) else str(a) for a in args)])


def show(run: Run, trace: Path, table: Path, expectations=()) -> None:
    """Print what was written, how to open it, then read the trace back and check the post's expectations."""
    print(f"\nwrote {typed(trace)}\n      {typed(table)}")
    print(f"open:  {uv_run('inspect_trace.py', '--open', Path(trace))}   (local, private)")
    print("       or drag the file into https://ui.perfetto.dev")
    # trace-util 0.2.0 needs Python >= 3.12; without --python, uvx on an older Python resolves 0.1.0 (no -f).
    print(f"share: uvx --python 3.12 trace-util -b BUCKET -f {typed(run.args.out.parent)}   (after `hf auth login`; "
          "the bucket is public; it mirrors the folder: bucket files not in it are deleted unless --no-delete)")
    loaded = inspect_trace.load_trace(trace)
    print()
    print(inspect_trace.report(loaded))
    if expectations:
        inspect_trace.print_expectations(inspect_trace.check(loaded, expectations))
    if run.args.plot:
        print(plot_next_to(loaded, trace))
    if run.args.open:
        from trace_reader import serve as serve_trace

        try:
            outcome = serve_trace.serve(trace, port=run.args.port)
        except serve_trace.ServeError as e:
            raise Fail(str(e)) from None
        if outcome == "interrupted":
            raise KeyboardInterrupt  # Ctrl-C while serving: exit 130, like any other Ctrl-C


def record(run: Run, step, annotation: str, shape: str, expectations=(),
           profile_memory: bool = False, flags: str = "") -> tuple[Path, Path]:
    """What every script ends with: profile `step`, write the trace and the table, read them back.

    `shape` and `flags` (the script's own trace-changing flags as tags) name the files: see Run.stem."""
    prof = profile(run, step, annotation, profile_memory)
    trace, table = export(run, prof, shape, flags)
    show(run, trace, table, expectations)
    return trace, table


# ------------------------------------ one process per rank (torchrun): the rest of its plumbing is torchrun_harness.py

def rank_report(run: Run, trace: Path, table: Path, expectations, world: int) -> None:
    """Every rank checks its own trace; rank 0 also prints its report and the merged report of all ranks (call it
    once every rank's trace is on disk: after a barrier)."""
    from trace_reader.analyzers import ranks

    loaded = inspect_trace.load_trace(trace)
    results = inspect_trace.check(loaded, expectations)
    if run.rank != 0:
        broken = [ex.text for ex, v, _ in results if v == "broken"]
        if broken:
            print(f"rank {run.rank}: broken: {'; '.join(broken)}")
        return
    show(run, trace, table)
    print("\nrank 0's expectations:")
    inspect_trace.print_expectations(results)
    files = [ranks.rank_file(trace, r) for r in range(world)]
    print(f"\nall {world} rank(s), merged ({uv_run('inspect_trace.py', *files)}):\n")
    try:
        print(ranks.text(ranks.analyze(ranks.load_run(files))))
    except inspect_trace.TraceError as e:  # the ranks' traces are written: say why they do not merge, as the reader would
        print(f"not merged: {e}")


def call_with_timeout(fn, seconds: float):
    """Run fn() in a daemon thread; raise TimeoutError if it takes longer (a hung network call stays behind)."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            box["error"] = e

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
