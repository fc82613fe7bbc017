"""Which kernels replaced which: pairing two traces' typical steps, unit by unit (match()).

On one typical step of each trace (its most common launch order), every unit (GPU kernel; on a CPU trace, one
of the CPU's kernels) is counted in exactly one place, so A's figures add up to A's own kernel time per step,
and B's to B's:
1. align()  (align.py) pairs the kernels that stayed: same name, same order, as many as any alignment can pair
            (an exact longest common subsequence); the "same name in both" table counts only these calls.
2. _group() puts the rest into the smallest groups the evidence supports, strongest evidence first:
            0. module: where one trace launched kernels with no CPU op (a fused module's Triton kernels, from
               Python) under an annotation that holds no kernel that stayed, both traces' kernels under an
               annotation of that name in that gap are one group: the module replaced whole (per layer);
            a. kind: a GEMM that left is paired with a GEMM that came (cuBLAS -> Triton template), one for one,
               preferring the one whose launching op recorded the same tensor sizes, then the nearest;
            b. what the kernels do: the words of the CPU op that launched each kernel (aten::gelu -> gelu), of
               the annotation or autograd Function around it up to the first span that also holds a kernel that
               stayed (LigerGELUMulFunction -> liger, gelu, mul), the op names Inductor writes into its kernel
               names (triton_poi_fused__unsafe_view_gelu_mul_0 -> unsafe, view, gelu, mul): each kernel joins
               the kernel of the other trace sharing the most words, at most MAX_GAP kept kernels away, the
               nearest gap first, then the one whose neighbours share words with its own (a for-loop optimizer's
               mul_ before lerp_ with foreach's _foreach_mul_ before _foreach_lerp_), then the nearest; pointwise
               work joins pointwise work before a GEMM (whose name may carry an op it fused);
            c. what is still alone: its words against any group (a GEMM template's name carries the epilogue
               it fused), then the tensor sizes the launching ops recorded;
            d. place: the nearest kernels of the other trace, grouped or not (eager attention's softmax joins
               bmm + bmm -> flash; kernels nothing else tells apart are replaced as a whole, REST, rather than
               paired by a guess).
            Kernels launched by one CPU op (a GEMM and its split-K reduce) always stay together.
            An op joined to an Inductor kernel only by one of the several ops its name lists, launched amid the
            ops of another replacement by eager library kernels (attention's scale mul and mask add between its
            two bmm, beside a compiled RoPE kernel named add, cat, mul, neg), is refused that link and grouped
            again (_islands): replaced work is launched in one run, except where Inductor reorders it.
            What nothing in the other trace took the place of is "only in A" (or B), by its calls.
3. A name can so appear in several places: its calls that stayed in the same-name table, another call of it in a
   group or an "only in" list (two calls becoming one: one stayed, one is gone). Each call is counted once; the
   table marks such a name. Times are per position, averaged over the steps with the typical launch order.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ..facts.kernels import input_dims, is_gemm
from ..reading.events import STEP_RE, Trace
from ..reading.files import no_gc
from .align import align
from .units import (
    GEMM_ORDER,
    GEMM_SIZES,
    MODULE,
    REST,
    SIZES,
    UNSEEN,
    Comparison,
    Replaced,
    Tally,
    Unit,
    hidden_work,
    in_compiled,
    launch_order,
    op_calls,
    op_of,
    tally_units,
    unit_key,
)

FOREACH_RE = re.compile(r"^(?:aten::)?(?:_foreach_)?")


MAX_GAP = 2  # kernels that stayed, at most, between two kernels paired by words, sizes or place


NEAR = 4  # per nearest gap, the atoms sharing a key on each side of x's offset that a link looks at (linear time)


INDUCTOR_RE = re.compile(r"(?:triton|cpp)_\w*?fused_(\w+?)(?:_\d+)?$")


STOP_WORDS = {"aten", "fused", "kernel", "function", "forward", "backward", "triton", "poi", "per", "red", "tem",
              "cpp", "graph", "call", "compiled", "fx", "torch", "region", "default", "out", "impl", "autograd"}


ATTENTION_RE = re.compile(r"flash|fmha|sdpa|attention", re.I)  # fused attention kernels (flash, cuDNN, mem-efficient)


MM_WORDS = {"mm", "addmm", "bmm", "baddbmm"}  # an Inductor template fusing one of these is a GEMM


GEMM_RANKS = 8  # a GEMM pairs with one at most this many GEMMs earlier or later in its gap (linear time)


ISLAND_ROUNDS = 4  # groupings at most, each refusing the weak links of atoms found inside another replacement


def _inductor(name: str) -> re.Match | None:
    """Inductor's kernel names are short (a few fused ops); a long name is not one, and is not searched."""
    return INDUCTOR_RE.search(name) if len(name) <= 300 else None


def _words(name: str) -> set[str]:
    """aten::gelu -> gelu; LigerGELUMulFunction -> liger, gelu, mul; triton_poi_fused__unsafe_view_gelu_mul_0 ->
    unsafe, view, gelu, mul."""
    m = _inductor(name)
    name = m.group(1) if m else name.split("::")[-1]
    return {w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+", name) if len(w) > 1} - STOP_WORDS


def _is_gemm(u: Unit) -> bool:
    """A GEMM by its op or name (kernels.is_gemm), or an Inductor template named after a matmul it runs; not a fused
    attention kernel, whose name may carry cutlass (pytorch_flash::flash_fwd_kernel<..., cutlass::bfloat16_t, ...>):
    it runs two matmuls and a softmax, no one GEMM's partner."""
    if ATTENTION_RE.search(u.name):
        return False
    return is_gemm(u) or (u.name.startswith("triton_tem_") and bool(_words(u.name) & MM_WORDS))


def _ancestors(units: list[Unit]) -> set[int]:
    """ids of the spans that hold these units (their ops and everything above them)."""
    seen: set[int] = set()
    for u in units:
        e = u.op
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            e = e.parent
    return seen


def _tags(u: Unit, shared: set[int]) -> set[str]:
    """Words for what this unit does: Inductor's name, its launching op, the spans around it that hold no anchor."""
    words = _words(u.name) if _inductor(u.name) else set()
    e = u.op
    while e is not None and not STEP_RE.match(e.name):
        words |= _words(e.name)
        e = e.parent
        if e is not None and id(e) in shared:
            break
    return words


def _sizes(u: Unit) -> set[str]:
    """Element counts of the launching op's tensor inputs (compiled, [64, 128, 3072] is [8192, 3072])."""
    out = set()
    for d in input_dims(u.op) if u.op is not None else []:
        if isinstance(d, list) and len(d) >= 2 and all(isinstance(x, int) for x in d):
            out.add(f"{math.prod(d)} elements")
    return out


@dataclass(eq=False)
class _Atom:
    """Unpaired units of one trace launched by one CPU op (or one unit): they are replaced together."""

    side: str  # "a" or "b"
    units: list[int]  # positions in the launch order
    gap: int  # kernels that stayed before it
    offset: int  # units before it since the last kernel that stayed
    tags: set[str]
    sizes: set[str]
    gemm: bool
    prev: _Atom | None = None  # the atoms launched just before and after it in its gap, on its side
    next: _Atom | None = None
    scope: str | None = None  # the innermost annotation around it that holds no kernel that stayed (a module's)
    bare: bool = False  # launched with no CPU op around it (from Python: a Triton kernel's launcher)
    what: str | None = None  # its op's name, less aten:: and _foreach_ (mul_ for a for-loop's and foreach's mul_)
    fused: set[str] = field(default_factory=set)  # the ops an Inductor kernel of it names (add, cat, mul, neg)
    compiled: bool = False  # launched inside a torch.compile'd region, whose code Inductor may have reordered


class _Union:
    """Groups of atoms, each with the evidence that joined it and the traces it holds atoms of."""

    def __init__(self):
        self.parent: dict = {}
        self.why: dict = defaultdict(set)
        self.sides: dict = {}  # root -> {"a", "b"} or one of them; a root never joined holds its own side
        self.strong: set = set()  # atoms joined by evidence of their own: a module, a GEMM, all its words, sizes
        self.weak: dict = defaultdict(set)  # atom -> its links to a fused kernel by some of the ops it names

    def find(self, x):
        self.parent.setdefault(x, x)
        while self.parent[x] is not x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, x, y, why: str, strength: str | None = "strong"):
        """strength: "strong", "weak" (one op of the several a fused kernel names) or None (place alone)."""
        if strength == "strong":
            self.strong |= {x, y}
        elif strength == "weak":
            self.weak[x].add(_pair(x, y))
            self.weak[y].add(_pair(x, y))
        rx, ry = self.find(x), self.find(y)
        if rx is not ry:
            self.parent[rx] = ry
            self.why[ry] |= self.why.pop(rx, set())
            self.sides[ry] = self.sides.pop(rx, {rx.side}) | self.sides.get(ry, {ry.side})
        self.why[ry].add(why)

    def alone(self, atoms: list[_Atom]) -> list[_Atom]:
        """The atoms whose group holds atoms of one trace only."""
        return [x for x in atoms if len(self.sides.get(self.find(x), ())) < 2]






def _pair(x: _Atom, y: _Atom) -> tuple[_Atom, _Atom]:
    """A link between an atom of A and one of B, A's first, whichever side linked."""
    return (x, y) if x.side == "a" else (y, x)


def _scope(u: Unit, shared: set[int]) -> str | None:
    """The name of the innermost annotation (record_function) around u's launch that holds no kernel that stayed."""
    e = u.op
    while e is not None and not STEP_RE.match(e.name) and id(e) not in shared:
        if e.cat == "user_annotation":
            return e.name
        e = e.parent
    return None


def _atoms(side: str, units: list[Unit], free: list[int], gap: list[int], tags: dict, sizes, shared) -> list[_Atom]:
    out: list[_Atom] = []
    by_op: dict[int, _Atom] = {}
    offset, last_gap = 0, -1
    for i in free:
        offset = offset + 1 if gap[i] == last_gap else 0
        last_gap = gap[i]
        op = op_of(units[i])
        launcher = op is not None and op.cat == "cpu_op"
        atom = by_op.get(id(op)) if launcher else None
        if atom is None:
            atom = _Atom(side, [], gap[i], offset, set(), set(), False, scope=_scope(units[i], shared),
                         bare=not launcher, what=FOREACH_RE.sub("", op.name) if launcher else None)
            out.append(atom)
            if launcher:
                by_op[id(op)] = atom
        atom.units.append(i)
        atom.tags |= tags[i]
        atom.sizes |= sizes(units[i])
        atom.gemm = atom.gemm or _is_gemm(units[i])
        if _inductor(units[i].name):
            atom.fused |= _words(units[i].name)
        atom.compiled = atom.compiled or in_compiled(units[i])
    for x, y in zip(out, out[1:]):
        if x.gap == y.gap:
            x.next, y.prev = y, x
    return out


def _index(atoms: list[_Atom], keys) -> dict:
    """key -> gap -> (offsets, atoms), sorted by offset."""
    idx: dict = defaultdict(lambda: defaultdict(lambda: ([], [])))
    for x in atoms:
        for k in keys(x):
            offs, xs = idx[k][x.gap]
            offs.append(x.offset)
            xs.append(x)
    return idx


def _near(idx: dict, key, x: _Atom) -> list[_Atom]:
    """Candidates for x under `key`, nearest x's offset first: in the nearest gaps to x's that hold any (at most
    MAX_GAP away; one below and one above at the same distance both count), the NEAR atoms at or after x's offset and
    the NEAR before it, not the whole gap. The bound keeps the pass linear in the atoms; a farther atom of the same
    gap sharing more words is not looked at."""
    by_gap = idx.get(key)
    if not by_gap:
        return []
    for dist in range(MAX_GAP + 1):
        found = []
        for g in {x.gap - dist, x.gap + dist}:
            if g in by_gap:
                offs, xs = by_gap[g]
                k = bisect.bisect_left(offs, x.offset)
                found += xs[max(k - NEAR, 0): k + NEAR]
        if found:
            return sorted(found, key=lambda y: abs(y.offset - x.offset))
    return []


def _distance(x: _Atom, y: _Atom) -> tuple[int, int]:
    return abs(x.gap - y.gap), abs(x.offset - y.offset)


def _link(uf: _Union, mine: list[_Atom], theirs: list[_Atom], keys, why, neighbours: bool = False,
          strength=lambda x, y: "strong", refused: frozenset = frozenset()) -> None:
    """Join each atom of `mine` to the atom of `theirs` sharing the most keys (tags, sizes), the nearest gap of
    those (at most MAX_GAP kept kernels away), then (with neighbours, for words) in that gap the one whose
    neighbours share keys with x's (a for-loop optimizer's param.mul_ before lerp_ and exp_avg_sq.mul_ after it,
    per parameter, against foreach's two _foreach_mul_ in the same places), then the nearest. why(x, y): the
    evidence, written down for the group; strength(x, y): how much it says (_Union.union); refused: links
    (_pair) not to make again."""
    idx = _index(theirs, keys)

    def alike(p, q):  # neighbours launched by the same op, a for-loop's or foreach's (add_ is not add)
        return p is not None and q is not None and p.what is not None and p.what == q.what

    for x in mine:
        kx = keys(x)
        # in sorted order: of equals the first found wins, and a set's order changes with PYTHONHASHSEED
        cands = {id(y): y for k in sorted(kx) for y in _near(idx, k, x) if _pair(x, y) not in refused}.values()
        if not cands:
            continue
        scored = [((-len(kx & keys(y)), gap), offset, y) for y in cands for gap, offset in [_distance(x, y)]]
        best, _, y = min(scored, key=lambda c: c[:2])
        if neighbours:  # among the equals in words and gap: the same op (add, not add_), then the same neighbours
            ties = [c for c in scored if c[0] == best]
            if len(ties) > 1:
                y = max(ties, key=lambda c: (alike(x, c[2]), alike(x.prev, c[2].prev) + alike(x.next, c[2].next),
                                             -c[1]))[2]
        uf.union(x, y, why(x, y), strength(x, y))


def _link_whole(uf: _Union, mine: list[_Atom], theirs: list[_Atom]) -> None:
    """Atoms that nothing tells apart: each joins every atom of `theirs` in the nearest gap (at most MAX_GAP kept
    kernels away), so the block is replaced as a whole, never split by launch position alone."""
    by_gap: dict[int, list[_Atom]] = defaultdict(list)
    for y in theirs:
        by_gap[y.gap].append(y)
    joined: set[int] = set()  # gaps whose atoms are one group already: x joins the first (linear, not |A| x |B|)
    for x in mine:
        for dist in range(MAX_GAP + 1):
            near = [g for g in {x.gap - dist, x.gap + dist} if g in by_gap]
            for g in near:
                if g not in joined:
                    joined.add(g)
                    for y, z in zip(by_gap[g], by_gap[g][1:]):
                        uf.union(y, z, REST, None)
                uf.union(x, by_gap[g][0], REST, None)
            if near:
                break


def _link_both(uf: _Union, side_a: list[_Atom], side_b: list[_Atom], keys, why, neighbours: bool = False,
               **kw) -> None:
    _link(uf, side_a, side_b, keys, why, neighbours, **kw)
    _link(uf, side_b, side_a, keys, why, neighbours, **kw)


def _join_modules(uf: _Union, atoms_a: list[_Atom], atoms_b: list[_Atom]) -> None:
    """A module whose kernels one trace launches with no CPU op (a fused module's Triton kernels, launched from
    Python: no op, no sizes, only the module's own words, which its other kernels share) is replaced whole: in one
    gap, the atoms of both traces under an annotation of the same name (model.layers.3.mlp) that holds no kernel
    that stayed, where one trace launched some of them bare, are one group. Else its two kernels were paired with
    eager's first two by launch position alone. Linear: each atom joins the first of its module's."""
    scopes: dict[tuple[int, str], list[_Atom]] = defaultdict(list)
    for x in atoms_a + atoms_b:
        if x.scope is not None:
            scopes[x.gap, x.scope].append(x)
    for xs in scopes.values():
        if len({x.side for x in xs}) == 2 and any(x.bare for x in xs):
            for x in xs[1:]:
                uf.union(xs[0], x, MODULE)


def _pair_gemms(uf: _Union, side_a: list[_Atom], side_b: list[_Atom]) -> None:
    """One for one: each GEMM of A that left with a GEMM of B that came, at most MAX_GAP kept kernels away: the
    same tensor sizes first, then the same rank among the GEMMs of its gap (the k-th that left, the k-th that came)."""
    def ranked(side):
        out, rank = [], Counter()
        for x in side:
            if x.gemm:
                out.append((x, rank[x.gap]))
                rank[x.gap] += 1
        return out

    by_gap: dict[int, list] = defaultdict(list)
    for y, r in ranked(side_b):
        by_gap[y.gap].append((y, r))
    taken: set[int] = set()
    for x, rx in ranked(side_a):
        cands = [(y, r) for g in range(x.gap - MAX_GAP, x.gap + MAX_GAP + 1)
                 for y, r in by_gap.get(g, [])[max(rx - GEMM_RANKS, 0): rx + GEMM_RANKS + 1] if id(y) not in taken]
        if cands:
            y, _ = min(cands, key=lambda c: (-len(x.sizes & c[0].sizes), abs(x.gap - c[0].gap), abs(rx - c[1])))
            taken.add(id(y))
            uf.union(x, y, GEMM_SIZES if x.sizes & y.sizes else GEMM_ORDER)


def _group(ua: list[Unit], ub: list[Unit], pairs: list[tuple[int, int]], hidden=(None, None)):
    """The units align() left unpaired, grouped (see the module's docstring): (groups, lone in A, lone in B),
    the lone ones as positions. Where a trace's work may be missing from it (`hidden`), the other's lone units
    are one group with an empty side, not "only in": what took their place is unknown, not nothing."""
    gap_a, gap_b = [0] * len(ua), [0] * len(ub)
    for k, (i, j) in enumerate(pairs + [(len(ua), len(ub))]):
        i0, j0 = (pairs[k - 1][0] + 1, pairs[k - 1][1] + 1) if k else (0, 0)
        gap_a[i0:i], gap_b[j0:j] = [k] * (i - i0), [k] * (j - j0)
    matched_a, matched_b = {i for i, _ in pairs}, {j for _, j in pairs}
    free_a = [i for i in range(len(ua)) if i not in matched_a]
    free_b = [j for j in range(len(ub)) if j not in matched_b]
    shared_a = _ancestors([ua[i] for i in matched_a])
    shared_b = _ancestors([ub[j] for j in matched_b])
    atoms_a = _atoms("a", ua, free_a, gap_a, {i: _tags(ua[i], shared_a) for i in free_a}, _sizes, shared_a)
    atoms_b = _atoms("b", ub, free_b, gap_b, {j: _tags(ub[j], shared_b) for j in free_b}, _sizes, shared_b)
    every = atoms_a + atoms_b
    # a fused kernel's partner by one of the ops it names, found inside another replacement's run, is refused and
    # the grouping done again: each round refuses more links, so it ends (in 1 round but for such islands)
    refused: frozenset = frozenset()
    for _ in range(ISLAND_ROUNDS):
        uf = _link_all(atoms_a, atoms_b, refused)
        more = _islands(uf, atoms_a, atoms_b) | _islands(uf, atoms_b, atoms_a)
        if more <= refused:
            break
        refused |= more

    comps: dict[int, tuple[list[int], list[int], set[str], set[str], _Atom]] = {}
    for x in every:
        root = uf.find(x)
        c = comps.setdefault(id(root), ([], [], set(), set(), root))
        c[0 if x.side == "a" else 1].extend(x.units)
        c[2 if x.side == "a" else 3].update(x.tags)
    groups, lone_a, lone_b = [], [], []
    for ia, jb, tags_a, tags_b, root in comps.values():
        if ia and jb:
            groups.append((ia, jb, ", ".join(sorted(tags_a & tags_b)) or _evidence(uf.why[root])))
        else:
            lone_a += ia
            lone_b += jb
    # the other trace does not show its work: what is left here is one group whose other side is unknown
    if hidden[1] and lone_a:
        groups, lone_a = groups + [(lone_a, [], UNSEEN)], []
    if hidden[0] and lone_b:
        groups, lone_b = groups + [([], lone_b, UNSEEN)], []
    return _merge(ua, ub, groups), sorted(lone_a), sorted(lone_b)


def _words_strength(x: _Atom, y: _Atom) -> str:
    """"weak" where a side is an Inductor kernel naming several ops and the other shares only some of them (mul of
    add, cat, mul, neg): this op may be one it fused, or another op of that name launched nearby."""
    shared = x.tags & y.tags
    return "weak" if any(len(f) > 1 and not f <= shared for f in (x.fused, y.fused)) else "strong"


def _link_all(atoms_a: list[_Atom], atoms_b: list[_Atom], refused: frozenset) -> _Union:
    """The groups, strongest evidence first (see the module's docstring), making none of the links refused."""
    def words(x, y):
        return ", ".join(sorted(x.tags & y.tags))

    def tags(x):
        return x.tags

    uf = _Union()
    _join_modules(uf, atoms_a, atoms_b)
    _pair_gemms(uf, atoms_a, atoms_b)
    alone = uf.alone
    by_words = dict(neighbours=True, strength=_words_strength, refused=refused)
    # pointwise work with pointwise work (and GEMMs no GEMM took), before a GEMM whose name carries its op
    _link_both(uf, alone(atoms_a), alone(atoms_b), tags, words, **by_words)
    # what is still alone: by words with any group (an epilogue a GEMM template fused), by tensor sizes, then by
    # place: the nearest kernels of the other trace, grouped or not
    _link(uf, alone(atoms_a), atoms_b, tags, words, **by_words)
    _link(uf, alone(atoms_b), atoms_a, tags, words, **by_words)
    _link_both(uf, alone(atoms_a), alone(atoms_b), lambda x: x.sizes, lambda x, y: SIZES, refused=refused)
    # what neither trace's words nor sizes pair: one group with what is left of the other trace near it, if any
    _link_whole(uf, alone(atoms_a), alone(atoms_b))
    place = dict(strength=lambda x, y: None, refused=refused)
    _link(uf, alone(atoms_a), atoms_b, lambda x: {"*"}, lambda x, y: REST, **place)
    _link(uf, alone(atoms_b), atoms_a, lambda x: {"*"}, lambda x, y: REST, **place)
    return uf


def _islands(uf: _Union, atoms: list[_Atom], others: list[_Atom]) -> frozenset:
    """The weak links (_words_strength) of atoms found inside another replacement, that cross it: in one gap of
    one trace, a run of atoms of one group, joined by weak links only, between two atoms of another group H that
    holds both traces, while their group has atoms of this trace outside the run. Where H's side in the other trace
    is library kernels launched by eager ops (none by Inductor or inside a compiled region, whose code may be fused
    and reordered at will), the run's links to kernels launched before or after that side are refused. Eager
    attention's scale mul and mask add, launched between its two bmm, are not the mul and add that a compiled RoPE
    kernel (triton_poi_fused_add_cat_mul_neg_0), launched before sdpa's flash kernel, fused, though they share its
    words."""
    per_group = Counter(uf.find(x) for x in atoms)
    span: dict = {}  # root -> (first, last) (gap, offset) of its atoms in the other trace, all library kernels
    for y in others:
        r = uf.find(y)
        lo, hi = span.get(r, ((y.gap, y.offset),) * 2)
        span[r] = (min(lo, (y.gap, y.offset)), max(hi, (y.gap, y.offset)))
    for y in others:
        if y.fused or y.bare or y.compiled:
            span[uf.find(y)] = None
    by_gap: dict[int, list[_Atom]] = defaultdict(list)
    for x in atoms:  # in launch order
        by_gap[x.gap].append(x)
    out: set = set()
    for xs in by_gap.values():
        roots = [uf.find(x) for x in xs]
        i = 0
        while i < len(xs):
            j = i
            while j + 1 < len(xs) and roots[j + 1] is roots[i]:
                j += 1
            run, h = xs[i:j + 1], roots[i - 1] if i else None
            if (h is not None and j + 1 < len(xs) and roots[j + 1] is h is not roots[i] and span.get(h)
                    and per_group[roots[i]] > len(run) and all(uf.weak[x] and x not in uf.strong for x in run)):
                lo, hi = span[h]
                for x in run:
                    for link in uf.weak[x]:
                        y = link[1] if x.side == "a" else link[0]
                        if not lo <= (y.gap, y.offset) <= hi:
                            out.add(link)
            i = j + 1
    return frozenset(out)


def _evidence(why: set[str]) -> str:
    for label in (MODULE, GEMM_SIZES, GEMM_ORDER, SIZES, REST):
        if label in why:
            return label
    return REST


def _merge(ua: list[Unit], ub: list[Unit], groups: list[tuple[list[int], list[int], str]]) -> list[Replaced]:
    """In launch order (of A, then of B for groups with nothing from A); the same replacement repeated (one per
    layer of a model) is one entry, `times` per step."""
    merged: dict[tuple, Replaced] = {}
    for ia, jb, by in sorted(groups, key=lambda g: (0, min(g[0])) if g[0] else (1, min(g[1]))):
        old, new = [ua[i].name for i in sorted(ia)], [ub[j].name for j in sorted(jb)]
        r = merged.setdefault((tuple(old), tuple(new), by), Replaced(old, new, defaultdict(float),
                                                                     defaultdict(float), 0, by))
        for i in ia:  # per position: only the kernels in this group, never a same-name kernel that stayed
            r.old_name_us[ua[i].name] += ua[i].us
        for j in jb:
            r.new_name_us[ub[j].name] += ub[j].us
        r.times += 1
    return list(merged.values())


def match(a: Trace, b: Trace) -> Comparison:
    """Which kernels stayed, which replaced which, which are gone or new (see the module's docstring)."""
    with no_gc():
        ua, na = launch_order(a)
        ub, nb = launch_order(b)
        pairs = align([u.name for u in ua], [u.name for u in ub], keys=([unit_key(u) for u in ua], [unit_key(u) for u in ub]))
        hidden = (hidden_work(a), hidden_work(b))
        groups, lone_a, lone_b = _group(ua, ub, pairs, hidden)
        kept: dict[str, tuple[Tally, Tally]] = {}
        for i, j in pairs:
            ta, tb = kept.setdefault(ua[i].name, (Tally(), Tally()))
            ta.add(ua[i])
            tb.add(ub[j])
        ca, cb = op_calls(a), op_calls(b)
    return Comparison(
        kept=kept, lone_a=tally_units(ua, lone_a), lone_b=tally_units(ub, lone_b), groups=groups,
        ops_gone={k: v for k, v in ca.items() if k not in cb},
        ops_new={k: v for k, v in cb.items() if k not in ca},
        steps_used=(na, nb), total_us=(sum(u.us for u in ua), sum(u.us for u in ub)), hidden=hidden,
    )
