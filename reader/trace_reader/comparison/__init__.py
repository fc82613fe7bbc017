"""Comparison: two traces, unit by unit: the kernels that stayed (align.py), which replaced which (pairing.py), the
comparison as data (compare.py)."""
