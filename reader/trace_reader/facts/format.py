"""Numbers and tables as the reader prints them: µs, counts, spreads, shares, quantiles, a plain text table."""

from __future__ import annotations


def text_table(headers: list[str], rows: list[list], right: set[int] = frozenset()) -> str:
    """A plain-text table: reads the same in a terminal, a pipe or a file."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(r):
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def fmt_us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}" if x < 1000 else f"{x:,.0f}"


def fmt_num(x: float) -> str:
    """Three significant figures at most, so a tiny GEMM reads 0.27, not 0."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2g}"


def fmt_spread(values: list[float]) -> str:
    return f"{fmt_us(min(values))}–{fmt_us(max(values))}" if len(values) > 1 else "-"


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def nearest_rank(values: list[float], q: float) -> float:
    """The value at quantile q of the sorted values (nearest rank): a real step's number, never an average."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def fmt_fixed(x: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if x is None else f"{x / scale:,.{digits}f}"


def fmt_gflop(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e9:,.0f}" if x >= 1e11 else f"{x / 1e9:.3g}"
