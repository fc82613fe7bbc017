"""Time as sets of intervals: merge overlapping [start, end) pairs, their total length, what two sets share."""

from __future__ import annotations

from typing import Iterable

Interval = tuple[float, float]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, non-overlapping intervals covering the same time (touching ones joined)."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def length(intervals: Iterable[Interval]) -> float:
    """Time covered at least once: overlapping intervals count once."""
    return sum(b - a for a, b in merge(intervals))


def intersection(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The time covered by both sets (each merged first), as sorted, non-overlapping intervals."""
    xs, ys = merge(a), merge(b)
    i = j = 0
    out: list[Interval] = []
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if hi > lo:
            out.append((lo, hi))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def common(a: Iterable[Interval], b: Iterable[Interval]) -> float:
    """Time covered by both sets (each merged first)."""
    return sum(hi - lo for lo, hi in intersection(a, b))


def gaps(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    """The parts of [lo, hi] that no interval covers."""
    out, at = [], lo
    for a, b in merge(intervals):
        if b <= at or a >= hi:
            continue
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if hi > at:
        out.append((at, hi))
    return out
