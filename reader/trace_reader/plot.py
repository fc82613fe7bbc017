"""python -m trace_reader.plot --bench RECORD.json: a benchmark record's chart, the command the docs give (the
drawing is render/plot.py's)."""

import sys

from .render.plot import main

if __name__ == "__main__":
    sys.exit(main())
