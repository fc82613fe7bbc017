"""Open one trace in the Perfetto UI without uploading it anywhere: the reader's server (trace_reader/serve.py says
how it works) as the suite's command.

    uv run serve_trace.py traces/03_simple_mlp/<file>.json
"""

import sys

import inspect_trace  # noqa: F401 - first: it finds the reader where uv did not install it
from trace_reader.serve import main

if __name__ == "__main__":
    sys.exit(main())
