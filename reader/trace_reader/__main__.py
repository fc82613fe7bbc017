"""python -m trace_reader TRACE ...: the reader's command (cli.py)."""

from .cli import run

run()
