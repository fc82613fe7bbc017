"""Which kernels stayed: a longest common subsequence of two launch orders, exact at any length.

align(a, b) pairs equal names of a and b, both in increasing order, as many pairs as any alignment has. Of the
alignments with that many, it prefers pairs whose keys agree (the launching op and its tensor sizes: of two GEMMs
with one kernel name, the projection stays paired with the projection, not with the attention's matmul) and, of
two same-name launches, the one at the same offset since the last kernel that stayed. The preference is greedy (5.
below), not an optimum over all longest alignments: A's GEMMs launched by bmm, mm against B's by mm, bmm, bmm are
paired bmm with mm and mm with bmm, though A's bmm with B's first bmm keeps two pairs, one of them agreeing. The
number of pairs is always the most there is.

How, exactly, in O(n*m/64) word operations at worst:
1. A name only one side has can never pair: such launches are dropped first, so kernels that were replaced
   cost nothing; a common head and tail pair at once.
2. A large block (LARGE cells) nearly alike (at most FEW launches unpaired) takes Myers' greedy diff (1986),
   O((n + m) * D): a step of 200,000 launches with three changes takes under a second here.
3. Otherwise bit-parallel LCS (Allison & Dix 1986, Hyyroe 2004): one row of the LCS table is one Python int, bit
   j set where the row's LCS does not grow at column j; a row costs a few big-int operations, one bit a column.
4. A block too large to keep its rows (ROWS_BITS) is cut Hirschberg's way: the last row of its top half and the
   last row of its bottom half run backwards give the column where an optimal alignment crosses the middle.
5. A traceback from the end takes a match where the names agree, unless their keys differ and skipping keeps the
   length; then each pair slides within the launches around it to a same-name launch whose key agrees, at the
   same offset (after Myers' diff, the slide alone applies the keys).
A trace is untrusted input: past MAX_CELLS (what is left to align after 1. and 2., n*m) it is refused in one line.
"""

from __future__ import annotations

import bisect
from itertools import accumulate

from ..reading.events import TraceError

ROWS_BITS = 1 << 27  # a block whose rows hold more bits than this (16 MiB) is halved rather than kept
FEW = 64  # a large block first tries Myers' O((n + m) * D) diff, for up to this many launches unpaired
LARGE = 1 << 20  # cells (n * m) from which a block is large
MAX_CELLS = 1 << 34  # ~130,000 launches a side left to align: about a minute here; more is refused


def align(a: list[str], b: list[str], keys: tuple[list, list] | None = None) -> list[tuple[int, int]]:
    """Pairs (i, j) with a[i] == b[j], increasing in both, as many as possible (see the module's docstring).

    keys: optional (keys of a, keys of b), any hashable per launch, None where unknown: a tie-break only."""
    shared = set(a) & set(b)
    ids: dict[str, int] = {}
    ia = [i for i, n in enumerate(a) if n in shared]
    ib = [j for j, n in enumerate(b) if n in shared]
    xa = [ids.setdefault(a[i], len(ids)) for i in ia]
    xb = [ids.setdefault(b[j], len(ids)) for j in ib]
    ka = kb = None
    if keys is not None:
        ka, kb = [keys[0][i] for i in ia], [keys[1][j] for j in ib]
    out: list[tuple[int, int]] = []
    _lcs(xa, xb, ka, kb, 0, len(xa), 0, len(xb), out, top=True)
    pairs = [(ia[i], ib[j]) for i, j in out]
    return _slide(a, b, keys, pairs)


def _agree(x, y) -> bool:
    return x is None or y is None or x == y


def _lcs(a, b, ka, kb, a0: int, a1: int, b0: int, b1: int, out: list, top: bool = False) -> None:
    """Appends to out an LCS of a[a0:a1] and b[b0:b1], in order; top: the whole problem, checked for size."""
    while a0 < a1 and b0 < b1 and a[a0] == b[b0] and (ka is None or _agree(ka[a0], kb[b0])):
        out.append((a0, b0))
        a0, b0 = a0 + 1, b0 + 1
    tail = []
    while a0 < a1 and b0 < b1 and a[a1 - 1] == b[b1 - 1] and (ka is None or _agree(ka[a1 - 1], kb[b1 - 1])):
        a1, b1 = a1 - 1, b1 - 1
        tail.append((a1, b1))
    n, m = a1 - a0, b1 - b0
    if n and m:
        few = _myers(a, b, a0, a1, b0, b1, FEW) if n * m > LARGE else None
        if few is not None:
            out += few
        elif top and n * m > MAX_CELLS:
            raise TraceError(f"steps of {n:,} and {m:,} launches left to align, far apart: more than this "
                             f"comparison aligns exactly ({MAX_CELLS:.1e} pairs); compare shorter steps")
        elif n * m <= ROWS_BITS or n == 1:
            out += _traceback(a, b, ka, kb, a0, a1, b0, b1)
        else:
            mid = a0 + n // 2
            top = _zeros_before(_last_row(a[a0:mid], b[b0:b1]), m)
            bottom = _zeros_before(_last_row(a[mid:a1][::-1], b[b0:b1][::-1]), m)
            # top[j] + bottom[m - j]: the most pairs of an alignment crossing the middle row at column j;
            # of the best, the column nearest the same offset as the middle row
            want = min(m, mid - a0)
            cut = max(range(m + 1), key=lambda j: (top[j] + bottom[m - j], -abs(j - want)))
            _lcs(a, b, ka, kb, a0, mid, b0, b0 + cut, out)
            _lcs(a, b, ka, kb, mid, a1, b0 + cut, b1, out)
    out.extend(reversed(tail))


def _myers(a, b, a0: int, a1: int, b0: int, b1: int, most: int) -> list[tuple[int, int]] | None:
    """An LCS of a[a0:a1] and b[b0:b1] by Myers' greedy diff (1986) when at most `most` launches of the two stay
    unpaired, else None. v[k] is the furthest x reached on diagonal k = x - y; one copy of v is kept per d."""
    off = most + 1
    v = [0] * (2 * most + 3)
    kept = []
    for d in range(most + 1):
        kept.append(v[:])
        for k in range(-d, d + 1, 2):
            x = v[off + k + 1] if k == -d or (k != d and v[off + k - 1] < v[off + k + 1]) else v[off + k - 1] + 1
            x = _snake(a, b, a0 + x, b0 + x - k, a1, b1) - a0
            v[off + k] = x
            if x >= a1 - a0 and x - k >= b1 - b0:
                return _myers_pairs(kept, off, a0, b0, x, x - k)
    return None


def _myers_pairs(kept: list[list[int]], off: int, a0: int, b0: int, x: int, y: int) -> list[tuple[int, int]]:
    """Back from (x, y) through the copies of v: each step's run of matches, then the edit before it."""
    pairs = []
    for d in range(len(kept) - 1, -1, -1):
        v, k = kept[d], x - y
        if d == 0:
            before, start = (0, 0), (0, 0)
        elif k == -d or (k != d and v[off + k - 1] < v[off + k + 1]):  # came down from diagonal k + 1
            before = (v[off + k + 1], v[off + k + 1] - k - 1)
            start = (before[0], before[1] + 1)
        else:  # came right from diagonal k - 1
            before = (v[off + k - 1], v[off + k - 1] - k + 1)
            start = (before[0] + 1, before[1])
        while x > start[0]:
            x, y = x - 1, y - 1
            pairs.append((a0 + x, b0 + y))
        x, y = before
    return pairs[::-1]


def _snake(a, b, x: int, y: int, x1: int, y1: int) -> int:
    """Where the run of equal launches from a[x], b[y] ends (its x): slices compared 8, 16, ... at a time."""
    step = 8
    while step >= 8:
        if x + step <= x1 and y + step <= y1 and a[x:x + step] == b[y:y + step]:
            x, y = x + step, y + step
            step *= 2
        else:
            step //= 2
    while x < x1 and y < y1 and a[x] == b[y]:
        x, y = x + 1, y + 1
    return x


def _masks(b: list[int]) -> dict[int, int]:
    """name -> the int with bit j set where b[j] is that name."""
    where: dict[int, list[int]] = {}
    for j, x in enumerate(b):
        where.setdefault(x, []).append(j)
    nbytes = (len(b) + 7) // 8
    out = {}
    for x, js in where.items():
        bits = bytearray(nbytes)
        for j in js:
            bits[j >> 3] |= 1 << (j & 7)
        out[x] = int.from_bytes(bits, "little")
    return out


def _rows(a: list[int], b: list[int], keep: bool):
    """The bit-parallel LCS rows of a against b: all of them (keep), or the last. Row i's bit j is 0 where
    LCS(a[:i], b[:j + 1]) = LCS(a[:i], b[:j]) + 1, so LCS(a[:i], b[:j]) is the count of 0 bits below j."""
    masks = _masks(b)
    v = (1 << len(b)) - 1
    rows = [v] if keep else None
    for x in a:
        u = v & masks.get(x, 0)
        v = (v + u) | (v - u)  # a carry past bit len(b)-1 is harmless: no mask reaches it; read through & ones
        if keep:
            rows.append(v)
    return rows if keep else v


def _last_row(a: list[int], b: list[int]) -> int:
    return _rows(a, b, keep=False)


def _zeros_before(v: int, m: int) -> list[int]:
    """[LCS with b[:j] for j in 0..m] from a last row: the 0 bits below each column."""
    bits = format(v & ((1 << m) - 1), f"0{m}b")[::-1] if m else ""
    return list(accumulate((c == "0" for c in bits), initial=0))


def _traceback(a, b, ka, kb, a0: int, a1: int, b0: int, b1: int) -> list[tuple[int, int]]:
    rows = _rows(a[a0:a1], b[b0:b1], keep=True)

    def lcs(i: int, j: int) -> int:  # LCS(a[a0:a0+i], b[b0:b0+j])
        return j - (rows[i] & ((1 << j) - 1)).bit_count()

    i, j, pairs = a1 - a0, b1 - b0, []
    while i and j:
        skip_b = (rows[i] >> (j - 1)) & 1  # LCS(i, j - 1) == LCS(i, j): b[j - 1] need not pair
        if a[a0 + i - 1] == b[b0 + j - 1]:
            keys_differ = ka is not None and not _agree(ka[a0 + i - 1], kb[b0 + j - 1])
            # keys differ: skip one side where the length allows, for a launch whose key agrees
            if keys_differ and skip_b:
                j -= 1
            elif keys_differ and lcs(i - 1, j) == lcs(i, j):
                i -= 1
            else:
                i, j = i - 1, j - 1
                pairs.append((a0 + i, b0 + j))
        elif skip_b:
            j -= 1
        else:
            i -= 1
    return pairs[::-1]


def _slide(a: list[str], b: list[str], keys, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each pair moves, within the unpaired launches between its neighbours, to a launch of the same name whose
    key agrees and, of those, to the one at the same offset since the previous pair: the count stays."""
    def index(seq, ks):
        by: dict = {}
        for i, n in enumerate(seq):
            by.setdefault(n, []).append(i)
            if ks is not None and ks[i] is not None:
                by.setdefault((n, ks[i]), []).append(i)
        return by

    ka, kb = keys if keys is not None else (None, None)
    where_a, where_b = index(a, ka), index(b, kb)
    out = list(pairs)
    for p, (i, j) in enumerate(out):
        pi, pj = out[p - 1] if p else (-1, -1)
        if i - pi == j - pj and (ka is None or _agree(ka[i], kb[j])):
            continue  # at the same offset already (a run of pairs), keys agreeing
        ni, nj = pairs[p + 1] if p + 1 < len(pairs) else (len(a), len(b))
        i = _nearest(where_a, a[i], kb[j] if kb is not None else None, ka, pi + (j - pj), pi, ni, i)
        j = _nearest(where_b, b[j], ka[i] if ka is not None else None, kb, pj + (i - pi), pj, nj, j)
        out[p] = (i, j)
    return out


def _nearest(where: dict, name: str, key, ks, target: int, lo: int, hi: int, now: int) -> int:
    """Of the launches named `name` strictly between lo and hi (now is one), the one nearest target, preferring
    a launch whose key agrees with `key`."""
    def agree(i):
        return ks is None or _agree(ks[i], key)

    best = (not agree(now), abs(now - target), now)
    for lst in (where.get((name, key)) if key is not None else None, where[name]):
        if not lst:
            continue
        k = bisect.bisect_left(lst, target)
        for i in lst[max(k - 1, 0): k + 1]:
            if lo < i < hi:
                best = min(best, (not agree(i), abs(i - target), i))
    return best[2]
