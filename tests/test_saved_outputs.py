"""Every saved output of the reader is what it was: plain, --json, --expect, comparisons and merged ranks over every
committed trace, hashed (tests/saved_outputs.py has the cases and the command that writes the hashes)."""

import pytest
import saved_outputs

CASES = saved_outputs.cases()


def test_every_committed_trace_has_its_cases():
    saved = saved_outputs.saved()
    assert sorted(saved) == sorted(CASES), "a trace was added or removed: python tests/saved_outputs.py --write"
    assert len(saved_outputs.traces()) > 80 and len(saved_outputs.rank_runs()) >= 6


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_is_what_was_saved(name):
    assert saved_outputs.run(CASES[name]) == saved_outputs.saved()[name], (
        f"{name}: the reader prints something else than before (args: {CASES[name]})")
