"""Every saved output of the reader is what it was: plain, --json, --expect, comparisons and merged ranks over every
committed trace, hashed (tests/saved_outputs.py has the cases and the command that writes the hashes)."""

import pytest
import saved_outputs

CASES = saved_outputs.cases()


def test_every_committed_trace_has_its_cases():
    saved = saved_outputs.saved()["printed"]
    assert sorted(saved) == sorted(CASES) == sorted(saved_outputs.saved()["portable"]), "a trace was added or removed: python tests/saved_outputs.py --write"
    assert len(saved_outputs.traces()) > 80 and len(saved_outputs.rank_runs()) >= 6


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_is_what_was_saved(name):
    """Byte for byte under the Python that saved them (the lock's, CI's); elsewhere their floats to 12 digits."""
    saved = saved_outputs.saved()
    printed, portable = saved_outputs.run(CASES[name])
    if saved["python"] == saved_outputs.python():
        assert printed == saved["printed"][name], f"{name}: the reader prints something else than before ({CASES[name]})"
    else:
        assert portable == saved["portable"][name], (
            f"{name}: the reader prints something else than before, past the last digits of a float ({CASES[name]})")


def test_the_portable_hash_forgives_a_floats_last_digits_only():
    """3.12's compensated sum() moves a float's last digits; the portable form forgives those, nothing more."""
    assert saved_outputs.rounded({"a": [0.4868586892052196]}) == saved_outputs.rounded({"a": [0.48685868920521946]})
    assert saved_outputs.rounded(20.470000000000002) == saved_outputs.rounded(20.47) == 20.47
    assert saved_outputs.rounded(0.486858689205) != saved_outputs.rounded(0.486858689206)
    assert saved_outputs.rounded([1, "x", None, True]) == [1, "x", None, True]
