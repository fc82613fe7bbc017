"""The reader's Python API as its docstring shows it (reader/trace_reader/__init__.py), on committed traces: each
call gives what the command prints for the same trace (the command's output is the reference, tests/saved_outputs)."""

import contextlib
import io
import json
from pathlib import Path

import pytest

import trace_reader as tr
import trace_reader.cli  # noqa: F401 - tr.cli, the command these calls are compared with

DATA = Path(__file__).resolve().parent / "data"
MLP = DATA / "h200_mlp_eager.json.gz"
COMPILED = DATA / "h200_mlp_compile.json.gz"
RANKS = [DATA / "dist" / f"cpu_ddp_rank{r}.json.gz" for r in (0, 1)]


def command(*args) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = tr.cli.main([str(a) for a in args])
    return code, out.getvalue()


def test_every_name_the_docstring_uses_is_there():
    doc = tr.__doc__
    for name in tr.__all__:
        assert hasattr(tr, name), name
    for used in ("load_trace", "report", "report_data", "compare", "comparison_data", "load_run", "ranks_data",
                 "ranks_text", "read_expectations", "check", "print_expectations", "schema_path", "SCHEMA_VERSION"):
        assert f"tr.{used}" in doc or used in doc, used
        assert used in tr.__all__, used


def test_one_trace_two_traces_and_a_run_are_what_the_command_prints():
    t = tr.load_trace(MLP)
    assert tr.report(t) + "\n" == command(MLP)[1]
    assert json.dumps(tr.report_data(t), indent=1) + "\n" == command("--json", MLP)[1]
    a, b = t, tr.load_trace(COMPILED)
    assert tr.compare(a, b) + "\n" == command(MLP, COMPILED)[1]
    assert json.loads(command("--json", MLP, COMPILED)[1]) == json.loads(json.dumps(tr.comparison_data(a, b)))
    run = tr.load_run([str(p) for p in RANKS])
    data = tr.ranks_data(run)
    assert tr.ranks_text(data) + "\n" == command(*RANKS)[1]
    assert data["schema_version"] == tr.SCHEMA_VERSION == tr.report_data(t)["schema_version"]
    assert json.loads(tr.schema_path("report").read_text())["x-version"] == tr.SCHEMA_VERSION


def test_your_own_guesses_through_the_api(tmp_path):
    mine = tmp_path / "mine.toml"
    mine.write_text('[[expect]]\nkernels_per_step = 5\n\n[[expect]]\nkernels_per_step = 4\n')
    t = tr.load_trace(MLP)
    guesses, said = tr.read_expectations(str(mine)).expectations(t)
    results = tr.check(t, guesses)
    assert [v for _, v, _ in results] == ["confirmed", "broken"]  # the eager MLP: 3 GEMMs + GeLU + mul
    out = io.StringIO()
    assert tr.print_expectations(results, file=out) == 1 and "BROKEN" in out.getvalue()
    code, text = command("--expect", mine, MLP)
    assert code == 1 and out.getvalue() in text


def test_bad_input_is_a_trace_error(tmp_path):
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(tr.TraceError, match="not a torch.profiler trace"):
        tr.load_trace(tmp_path / "x.json")
