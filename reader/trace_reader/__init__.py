"""Read a torch.profiler trace back: what ran, what launched it, how fast, and was the guess right.

The API (the command, `torch-trace`, is cli.py; the JSON it prints is described by the schemas in schemas/):

    import trace_reader as tr

    t = tr.load_trace("run.json.gz")          # a Trace: steps, their CPU spans and the GPU work they launched
    print(tr.report(t))                       # the report as text; tr.report_data(t): as data (--json)
    print(tr.compare(a, b))                   # what changed between two traces; tr.comparison_data(a, b): as data
    run = tr.load_run(["r_rank0.json", "r_rank1.json"])   # or a folder: one distributed run's ranks
    print(tr.ranks_text(tr.ranks_data(run)))  # merged by rank; tr.ranks_data(run): as data
    guesses, said = tr.read_expectations("mine.toml").expectations(t)   # your own guesses (docs/expect_file.md)
    results = tr.check(t, guesses)            # (Expect, "confirmed" | "broken" | "not applicable", what was seen)
    tr.print_expectations(results)            # the ok / BROKEN / n/a lines; returns how many are broken

The JSON of report_data, comparison_data and ranks_data begins with schema_version (SCHEMA_VERSION); its schema is
the file schema_path("report" | "comparison" | "ranks").

Bad input raises TraceError, whose message is one line meant for the user.

The rooms, lowest first: a file imports only from its own room or the rooms below it (docs/layout.md):

    reading/      a trace file into a Trace: events.py (what the reader holds), files.py (the file, capped: a
                  trace is untrusted input), fast_json.py (msgspec's decoding), tree.py (call tree, steps, launches)
    facts/        what a kernel or op is and does (kernels.py: GEMM or pointwise, FLOPs, bytes, dtype, the CPU's
                  kernels), what the device could do (peaks.py), interval arithmetic (intervals.py), numbers and
                  tables as text (format.py), the JSON schemas' version and files (schema.py; schemas/)
    expectation.py  Expect, NotApplicable, check(), print_expectations(): a guess and its verdict
    analyzers/    one question each: steps.py (each step's verdict, why the GPU idles), annotations.py, lag.py,
                  compiled.py (torch.compile's regions), memory.py and memory_timeline.py, passes.py and
                  training.py (a training step's phases; training_expect.py: 07's guesses), collectives.py and
                  ranks.py (one rank's calls; a run's ranks merged; 08's guesses), data_parallel.py (09's guesses),
                  modules.py (per module of a model; 06's guesses), guesses.py (the guesses rungs 01-05 are made
                  of), report.py (the one-trace report as data)
    comparison/   two traces: align.py (the kernels that stayed), units.py, pairing.py (which replaced which),
                  compare.py (the comparison as data)
    render/       text and pictures: report_text.py, compare_text.py, training_text.py, plot.py (roofline,
                  benchmark bars), memory_picture.py
    top           scripts.py (the suite's scripts' guesses for a saved trace), declared.py (your own, from a TOML
                  file), serve.py (the Perfetto UI, local only), cli.py, this file
"""

from .analyzers.ranks import analyze as ranks_data
from .analyzers.ranks import load_run
from .analyzers.ranks import text as ranks_text
from .analyzers.report import report_data
from .comparison.compare import comparison_data
from .declared import read as read_expectations
from .expectation import Expect, NotApplicable, check, print_expectations
from .facts.schema import SCHEMA_VERSION, schema_path
from .reading.events import Trace, TraceError
from .reading.files import load_trace
from .reading.tree import parse_trace
from .render.compare_text import compare
from .render.report_text import report

__all__ = ["SCHEMA_VERSION", "Expect", "NotApplicable", "Trace", "TraceError", "check", "compare", "comparison_data",
           "load_run", "load_trace", "parse_trace", "print_expectations", "ranks_data", "ranks_text", "read_expectations",
           "report", "report_data", "schema_path"]
