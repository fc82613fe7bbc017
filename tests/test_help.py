"""--help, word for word: what a reader sees for the flags every script shares (common.parser), for bench.py, the
chart command (python -m trace_reader.plot) and serve_trace.py.

Compared with the files in tests/data/help/, written once and read by eye. After a deliberate change to a flag's
help, write them again with `uv run python tests/test_help.py` and read the diff before committing it.
The width is fixed (COLUMNS=1000: one line per flag) and the checkout's own path is replaced by <root>, so the
files are the same on every machine."""

import contextlib
import io
import os
import sys
from pathlib import Path
from unittest import mock

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench  # noqa: E402
import common  # noqa: E402

GOLDEN = Path(__file__).parent / "data" / "help"
# A script's docstring and sizes, made up here: the shared flags are what is pinned, not one script's.
DOC = "A made-up script's first line.\n\nIts second paragraph, which --help leaves out."


def common_help():
    with mock.patch.object(sys, "argv", ["script.py"]):  # argparse names the program after argv[0]
        return _normal(common.parser(DOC, on_cpu="a CPU run says so", batch=8, seq=1024).format_help())


def help_of(main, argv0: str) -> str:
    """What `main(["--help"])` prints (argparse prints it, then exits 0), run as `argv0`."""
    out = io.StringIO()
    with mock.patch.object(sys, "argv", [argv0]), contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    return _normal(out.getvalue())


def bench_help():
    return help_of(bench.parse_args, "bench.py")


def plot_help():
    from trace_reader.render import plot

    return help_of(plot.main, "plot.py")  # its prog is set: python -m trace_reader.plot


def serve_help():
    from trace_reader import serve as serve_trace

    return help_of(serve_trace.main, "serve_trace.py")


def _normal(text):
    return text.replace(str(common.ROOT), "<root>")


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")


SCRIPTS = ["01_matmul_add", "02_linear", "03_simple_mlp", "03_kernels_mlp", "04_fused_mlp", "05_attention",
           "06_model", "07_train_step", "08_tensor_parallel", "09_data_parallel"]


class _Parsed(Exception):
    pass


def script_parser(name):
    """The parser a numbered script's main() builds, caught at its parse_args (nothing of the run happens)."""
    import importlib

    module = importlib.import_module(name)
    with mock.patch.object(common.FlagParser, "parse_args", lambda self, *a, **k: (_ for _ in ()).throw(_Parsed(self))), \
            mock.patch.object(sys, "argv", [f"{name}.py"]), pytest.raises(_Parsed) as e:
        module.main()
    return e.value.args[0]


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_flag_has_help_and_says_its_default_once(name):
    p = script_parser(name)
    assert [a.dest for a in p._actions if not a.help] == []  # --phase and --optimizer had none
    text = p.format_help()
    assert "(default: None)" not in text
    for a in p._actions:
        assert p._get_formatter()._get_help_string(a).count("(default:") <= 1, a.dest
    if name in ("05_attention", "06_model"):  # their sizes are not the posts': the posts have no such block
        assert "the post uses" not in text


def test_the_shared_flags_help_word_for_word():
    assert common_help() == (GOLDEN / "common.txt").read_text(), "common.parser's --help changed: see the docstring"


def test_bench_help_word_for_word():
    assert bench_help() == (GOLDEN / "bench.txt").read_text(), "bench.py --help changed: see the docstring"


def test_the_chart_commands_help_word_for_word():
    assert plot_help() == (GOLDEN / "plot.txt").read_text(), "trace_reader.plot --help changed: see the docstring"


def test_the_trace_servers_help_word_for_word():
    assert serve_help() == (GOLDEN / "serve_trace.txt").read_text(), "serve_trace.py --help changed: see the docstring"


if __name__ == "__main__":  # write the files again, after a deliberate change
    os.environ["COLUMNS"] = "1000"
    GOLDEN.mkdir(parents=True, exist_ok=True)
    (GOLDEN / "common.txt").write_text(common_help())
    (GOLDEN / "bench.txt").write_text(bench_help())
    (GOLDEN / "plot.txt").write_text(plot_help())
    (GOLDEN / "serve_trace.txt").write_text(serve_help())
    print(f"wrote {GOLDEN}/common.txt, bench.txt, plot.txt and serve_trace.txt")
