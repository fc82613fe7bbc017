"""The JSON Schemas (draft 2020-12) of what `inspect_trace.py --json` prints, and their version (docs/json.md).

Three forms, one file each under trace_reader/schemas/: "report" (one trace: analyzers/report.report_data),
"comparison" (two traces: comparison/compare.comparison_data), "ranks" (one distributed run's ranks merged:
analyzers/ranks.analyze); each puts SCHEMA_VERSION first, as "schema_version". Every schema
file carries SCHEMA_VERSION (its "x-version", the end of its "$id", the const of "schema_version"); any change to
a schema file bumps it, and tests/data/schema_lock.json records each version's files (tests/test_json_schema.py).
"""

from __future__ import annotations

from pathlib import Path

SCHEMA_VERSION = 1
FORMS = ("report", "comparison", "ranks")
_DIR = Path(__file__).resolve().parent.parent / "schemas"  # the package's schemas/


def schema_path(form: str) -> Path:
    """The schema file of one form of the --json output: "report", "comparison" or "ranks"."""
    if form not in FORMS:
        raise ValueError(f"no JSON schema for {form!r}: the forms are {', '.join(FORMS)}")
    return _DIR / f"{form}.schema.json"
