"""Read a torch.profiler trace back: what ran, what launched it, how fast, and was the guess right.

    uv run inspect_trace.py traces/03_simple_mlp/64x128x768x3072_bf16_cold_eager.json
    uv run inspect_trace.py --full-names TRACE          # kernel names untruncated
    uv run inspect_trace.py EAGER.json COMPILED.json    # what changed between two runs
    uv run inspect_trace.py --json EAGER.json COMPILED.json   # the same, as data for your own scripts
    uv run inspect_trace.py --open TRACE                # serve it to the Perfetto UI (local only)
    uv run inspect_trace.py --expect 03_simple_mlp TRACE  # check a saved trace against a script's guesses
    uv run inspect_trace.py --expect my_guesses.toml TRACE  # ... or your own (docs/expect_file.md)
    uv run inspect_trace.py --json TRACE > report.json  # the whole report as data, for your own scripts
    uv run inspect_trace.py RUN_rank0.json RUN_rank1.json  # the ranks of one distributed run, merged
    uv run inspect_trace.py --ranks FOLDER              # a folder holding one distributed run's rank traces

The reader is the package in reader/ (trace_reader: one room per kind of question, docs/layout.md; what the
report holds: reader/trace_reader/cli.py and docs/reading_traces.md), installable alone as `torch-trace`. This
file is its command in the suite, which also knows the suite's scripts (--expect SCRIPT), and the names the scripts
build their guesses from.
"""

from __future__ import annotations

import gc
import importlib
import sys

try:
    import trace_reader  # noqa: F401 - installed by `uv run` (a workspace member, editable)
except ModuleNotFoundError:  # the checkout run by a Python of its own (python3 03_simple_mlp.py): the reader beside it
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().with_name("reader")))

# Re-exported: the scripts, common.py, bench_inspect.py and the tests use them as inspect_trace.<name>.
from trace_reader import cli, scripts
from trace_reader.analyzers.annotations import gpu_time_by_annotation
from trace_reader.analyzers.guesses import bound, cpu_event, cpu_op, kernel, kernels_per_step, occupancy_before_gemms, steps, views_launch_nothing
from trace_reader.analyzers.report import cpu_self_times, report_data
from trace_reader.analyzers.steps import bound_of
from trace_reader.comparison.compare import comparison_data
from trace_reader.comparison.pairing import match
from trace_reader.expectation import Expect, NotApplicable, check, need_steps, print_expectations
from trace_reader.facts.kernels import cpu_kernels
from trace_reader.facts.peaks import device_peak
from trace_reader.reading.events import OCCUPANCY, WHOLE_TRACE, Trace, TraceError
from trace_reader.reading.files import load_trace, read_json
from trace_reader.reading.tree import parse_trace
from trace_reader.render.compare_text import compare
from trace_reader.render.report_text import report
from trace_reader.scripts import SCRIPTS

__all__ = ["OCCUPANCY", "SCRIPTS", "WHOLE_TRACE", "Expect", "NotApplicable", "Trace", "TraceError", "bound", "bound_of",
           "check", "compare", "comparison_data", "cpu_event", "cpu_kernels", "cpu_op", "cpu_self_times", "device_peak",
           "expectations_for", "gpu_time_by_annotation", "kernel", "kernels_per_step", "load_trace", "main", "match",
           "need_steps", "occupancy_before_gemms", "parse_trace", "print_expectations", "read_json", "report",
           "report_data", "steps", "views_launch_nothing"]


def expectations_for(script: str, trace: Trace):
    """A script's expectations for a saved trace, the script imported from this suite (trace_reader/scripts.py)."""
    return scripts.expectations_for(script, trace, importlib.import_module)


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, prog="inspect_trace.py", load_script=importlib.import_module)


if __name__ == "__main__":
    code = main()
    gc.freeze()  # the trace's cyclic tree is garbage now: skip the final collection (cli.run says why)
    sys.exit(code)
