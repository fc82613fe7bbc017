"""Read a torch.profiler trace back: what ran, what launched it, how fast, and was the guess right.

    torch-trace traces/03_simple_mlp/64x128x768x3072_bf16_cold_eager.json
    torch-trace --full-names TRACE          # kernel names untruncated
    torch-trace EAGER.json COMPILED.json    # what changed between two runs
    torch-trace --json EAGER.json COMPILED.json   # the same, as data for your own scripts
    torch-trace --open TRACE                # serve it to the Perfetto UI (local only)
    torch-trace --expect 03_simple_mlp TRACE  # check a saved trace against a script's guesses
    torch-trace --expect my_guesses.toml TRACE  # ... or your own (docs/expect_file.md)
    torch-trace --json TRACE > report.json  # the whole report as data, for your own scripts
    torch-trace RUN_rank0.json RUN_rank1.json  # the ranks of one distributed run, merged
    torch-trace --ranks FOLDER              # a folder holding one distributed run's rank traces

One trace: device and versions; per active ProfilerStep, the GPU kernels in launch order with the CPU op
that launched each (via the "External id" / "correlation" links), calls per step, duration over the steps,
share of GPU time, achieved TFLOP/s (GEMMs, 2*M*K*N from the op's "Input Dims") or GB/s (pointwise, bytes
of inputs and outputs), against the device's datasheet peak; GPU busy vs step time (overhead-, partly overhead-
or compute-bound), judged per step, with the typical (median) step's verdict; how far the GPU lags the CPU
(launch to kernel start) and why it idles (waiting on the host, or after the launch); GPU and CPU time per
record_function annotation; compiled regions (graph breaks, recompiles); CPU self time of the top ops and runtime calls; the view ops and their (zero)
CUDA time; the occupancy queries before launches. A long trace shows its first and last steps and quantiles
(--all-steps: every step). A CPU-only trace gets the CPU side instead: ops by self time, the CPU's kernels in
order, thread by thread (Inductor's fused C++ kernels, GEMMs, computing aten ops).

A trace is untrusted input: reading it is capped (1 GiB of JSON, after gzip), and the files it names (an
Inductor kernel's source, for exact bytes of its in/out buffers) are read only with --kernel-files.
Bad input is one line on stderr and exit code 2; a broken expectation under --expect, exit code 1.

Two traces: kernels with byte-for-byte the same name (calls per step, time per call), kernels only in one of
them, which kernels replaced which (paired by what they do: the launching op, Inductor's kernel name, the
annotation around the launch, tensor sizes; never by position alone), CPU ops that disappeared or appeared,
per-step GPU and CPU time side by side.

The traces of one distributed run (every rank's file, or a folder holding them; 08_tensor_parallel.py): merged by
the rank in each trace's distributedInfo: per rank and step, busy, compute and communication time, how much of
the communication overlapped compute and how much was exposed; per collective, the skew between ranks, the
straggler, its size, algorithm and bus bandwidth (trace_reader/ranks.py).

The scripts declare what the post says their trace should show (`Expect`, built with `steps()`,
`kernel()`, ...); `check()` reads the trace and says confirmed, broken or not applicable.

The reader lives in the rooms of this package, one file per question (docs/layout.md, or the package's
__init__.py); this file is the command: `torch-trace`, `python -m trace_reader`, and the suite's inspect_trace.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from typing import Callable

from . import declared
from . import serve as serve_trace
from .analyzers import ranks
from .analyzers.report import report_data
from .comparison.compare import comparison_data
from .expectation import check, print_expectations
from .reading.events import TraceError
from .reading.files import load_trace
from .render.compare_text import compare
from .render.report_text import report
from .scripts import SCRIPTS, expectations_for


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage block
        raise TraceError(message)


def main(argv: list[str] | None = None, prog: str = "torch-trace",
         load_script: Callable[[str], object] | None = None) -> int:
    """The command: report one trace, compare two, merge one run's ranks, check guesses. prog names it in its lines;
    load_script(name) imports one of the suite's scripts for --expect SCRIPT (the suite's inspect_trace.py passes
    importlib.import_module; the reader installed alone has none: --expect FILE.toml)."""
    p = _Parser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+", metavar="TRACE", help="one trace to report, or two (A B) to compare; the "
                   "traces of one distributed run (or a folder holding them) to merge by rank")
    p.add_argument("--ranks", action="store_true", help="read the files as the ranks of one distributed run (implied "
                   "by a folder, by more than two traces, and by two traces of different ranks of one run)")
    p.add_argument("--full-names", action="store_true", help="print kernel names untruncated")
    p.add_argument("--all-steps", action="store_true", help="list every step (default: a long trace shows its "
                   "first and last steps and quantiles)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of text (two traces: the comparison)")
    p.add_argument("--expect", metavar="SCRIPT|FILE",
                   help=f"check the trace against a script's expectations ({', '.join(SCRIPTS)}); "
                   "its mode and steps are read from the trace; or against your own, a TOML file (a .toml, or any "
                   "file but a .py; docs/expect_file.md)")
    p.add_argument("--kernel-files", action="store_true", help="read the Inductor kernel sources the trace names "
                   "(regular files under 1 MiB on this machine, 2 s in all) for exact bytes moved; off: a trace "
                   "never makes the reader open another file")
    p.add_argument("--open", action="store_true", help="serve the trace to the Perfetto UI (local only)")
    p.add_argument("--port", type=int, default=None, help="port for --open (default: serve_trace's 9001)")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the roofline (two traces: both, with arrows)")
    try:
        args = p.parse_args(argv)
        own = declared.read(args.expect) if declared.names_file(args.expect) else _check_expect(args.expect)
        if args.ranks or len(args.traces) > 2 or any(os.path.isdir(t) for t in args.traces):
            return _merged(args, ranks.load_run(args.traces))
        if len(args.traces) == 2 and args.expect:
            raise TraceError("--expect takes one trace")
        port = {} if args.port is None else {"port": args.port}
        if args.open:  # a busy port is one line now, not after the whole report
            try:
                serve_trace.check_port(port.get("port", serve_trace.DEFAULT_PORT))
            except serve_trace.ServeError as e:
                raise TraceError(str(e)) from None
        traces = [load_trace(t, kernel_files=args.kernel_files) for t in args.traces]
        if len(traces) == 2 and ranks.two_ranks(traces):  # rank 0 and rank 1 of one run: merged, not compared
            return _merged(args, ranks.join(traces))
        if args.plot:
            from .render.plot import (
                check_drawable,  # matplotlib loads only when a picture is drawn
            )

            check_drawable(traces, args.plot)  # a CPU trace, a bad file name, a read-only folder: one line, first
        broken = 0
        if len(traces) == 1:
            results = None
            if args.expect:
                exps, said = (own.expectations(traces[0]) if own else
                              expectations_for(args.expect, traces[0], load_script))
                results = check(traces[0], exps)
                broken = sum(v == "broken" for _, v, _ in results)
            if args.json:
                data = report_data(traces[0])
                if results is not None:
                    data["expectations"] = [{"guess": ex.text, "verdict": v, "seen": d} for ex, v, d in results]
                print(json.dumps(data, indent=1))
            else:
                print(report(traces[0], args.full_names, args.all_steps))
                if results is not None:
                    print(f"\n{said}")
                    print_expectations(results)
        elif args.json:
            print(json.dumps(comparison_data(traces[0], traces[1]), indent=1))
        else:
            print(compare(traces[0], traces[1], args.full_names))
        if args.plot:
            from .render.plot import (
                plot_traces,  # matplotlib loads only when a picture is asked for
            )

            print(plot_traces(traces, args.plot), file=sys.stderr if args.json else sys.stdout)  # JSON stays clean
        if args.open:
            try:
                serve_trace.serve(args.traces[-1], **port)
            except serve_trace.ServeError as e:
                raise TraceError(str(e)) from None
    except TraceError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `... | head` closed the pipe: not an error worth a traceback
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        return 0
    return 1 if broken else 0


def _check_expect(script: str | None) -> None:
    """--expect names a script whose guesses the reader can choose from a trace; 05_attention's cannot be."""
    if script is None or script in SCRIPTS:
        return
    if script.removesuffix(".py") == "05_attention":
        raise TraceError("--expect 05_attention: its guesses depend on --impl, --backend and --decode, which its "
                         "trace does not say; 05_attention.py checks them itself after each run")
    raise TraceError(f"--expect {script}: not one of the scripts it knows ({', '.join(SCRIPTS)})")


def _merged(args, traces) -> int:
    """The ranks of one distributed run, merged (analyzers/ranks.py)."""
    for flag in ("expect", "open"):
        if getattr(args, flag):
            raise TraceError(f"--{flag} reads one trace: give one rank's trace, not the whole run")
    if args.plot:
        from .render.plot import (
            check_png_path,  # matplotlib loads only when a picture is drawn
        )

        check_png_path(args.plot)  # a bad file name or a read-only folder: one line, before the report
    data = ranks.analyze(traces)
    print(json.dumps(data, indent=1) if args.json else ranks.text(data))
    if args.plot:
        from .render.plot import plot_ranks

        written = plot_ranks(ranks.lanes(traces), args.plot)
        print(f"wrote {written} (the ranks side by side)", file=sys.stderr if args.json else sys.stdout)
    return 0


def run() -> None:
    """The console command (torch-trace, python -m trace_reader)."""
    code = main()
    # The trace's tree (parents <-> children) is cyclic garbage now; the process ends, so skip the final
    # collection over 10^5-10^6 objects (about half the run time on a 35 MB trace).
    gc.freeze()
    sys.exit(code)
