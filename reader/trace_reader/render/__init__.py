"""Rendering: the report, the comparison and the training section as text; the roofline, the benchmark bars and the
memory timeline as pictures (matplotlib, imported only when one is drawn)."""
