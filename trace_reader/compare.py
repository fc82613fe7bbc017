"""Comparing two traces: which kernels stayed, which replaced which, which are gone or new; CPU ops; step times;
training phases and communication where the traces have them.

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
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from .align import align  # re-exported: bench_inspect.py and the tests call compare.align
from .compiled import REGION_PREFIX
from .kernels import CPP_KERNEL_RE, _dims, cpu_kernels, is_gemm, short, typical_sequence
from .read import STEP_RE, Event, Trace, _no_gc
from .report import _table, _us


@dataclass
class Unit:
    """One position of a step's launch order: a GPU kernel, or one of the CPU's kernels on a CPU trace."""

    name: str
    us: float  # mean over the steps with this launch order
    op: Event | None  # the CPU op that launched it (on a CPU trace: the op itself)


@dataclass
class Tally:
    """Calls per step of one name, and their µs per step."""

    calls: int = 0
    us: float = 0.0

    def add(self, u: Unit) -> None:
        self.calls += 1
        self.us += u.us


@dataclass
class Replaced:
    """A's kernels `old` (launch order) became B's `new`, `times` times per step; µs per step over all times."""

    old: list[str]
    new: list[str]
    old_name_us: dict[str, float]  # µs per step of each name, over all `times`
    new_name_us: dict[str, float]
    times: int
    by: str  # what paired them: "gelu, mul", "GEMM for GEMM, ...", "tensor sizes", or REST

    @property
    def old_us(self) -> float:
        return sum(self.old_name_us.values())

    @property
    def new_us(self) -> float:
        return sum(self.new_name_us.values())

    def calls(self, side: str) -> dict[str, int]:
        """Calls per step of each name, over all `times`."""
        return {n: c * self.times for n, c in Counter(self.old if side == "old" else self.new).items()}


REST = "nothing tells them apart: the nearest kernels left, replaced as a whole"
GEMM_SIZES = "GEMM for GEMM, the same tensor sizes"
GEMM_ORDER = "GEMM for GEMM, in launch order"
SIZES = "tensor sizes"
UNSEEN = "nothing: the other trace does not record this work"
MODULE = "the same module, its kernels launched with no op in one trace: replaced as a whole"
# A compiled CPU run records its fused C++ kernels only when asked: its work is then in no span of the trace.
HIDDEN_CPP = ("compiled C++ kernels are not in the trace: profile with "
              "torch._inductor.config.cpp.enable_kernel_profile")


@dataclass
class Comparison:
    kept: dict[str, tuple[Tally, Tally]]  # name -> A's and B's calls that stayed (paired by align), A's order
    lone_a: dict[str, Tally]  # A's calls that nothing in B took the place of
    lone_b: dict[str, Tally]
    groups: list[Replaced]
    ops_gone: dict[str, float]  # CPU op -> calls per step in A, absent from B
    ops_new: dict[str, float]
    steps_used: tuple[int, int]  # steps of A and B with the typical launch order (the per-position times)
    total_us: tuple[float, float]  # each trace's units, µs per step: kept + groups + lone, nothing twice
    hidden: tuple[str | None, str | None]  # why a trace's own work may be missing from it, if it may

    @property
    def same(self) -> list[str]:
        return list(self.kept)

    @property
    def only_a(self) -> list[str]:
        return list(self.lone_a)

    @property
    def only_b(self) -> list[str]:
        return list(self.lone_b)

    @property
    def replaced(self) -> list[tuple[list[str], list[str]]]:
        return [(g.old, g.new) for g in self.groups]


# ------------------------------------------------------------------------------------- steps and positions

def _step_units(trace: Trace, step) -> list[tuple[str, float, Event | None]]:
    if trace.device == "cuda":
        return [(k.name, k.dur, k.op) for k in step.kernels]
    return [(e.name, e.dur, e) for e in cpu_kernels(step)]


def launch_order(trace: Trace) -> tuple[list[Unit], int]:
    """The typical step's units, each timed as the mean over the steps with that launch order; and how many."""
    seq = typical_sequence(trace)
    steps = [u for u in (_step_units(trace, st) for st in trace.steps) if [n for n, _, _ in u] == seq]
    if not steps:
        return [], 0
    means = [math.fsum(col) / len(steps) for col in zip(*([dur for _, dur, _ in s] for s in steps))]
    return [Unit(name, us, op) for (name, _, op), us in zip(steps[0], means)], len(steps)


def _op_calls(trace: Trace) -> dict[str, float]:
    n = max(len(trace.steps), 1)
    c: Counter = Counter(e.name for st in trace.steps for e in st.spans)
    return {k: v / n for k, v in c.items() if not STEP_RE.match(k)}  # one match per name, not per span


def _hidden(trace: Trace) -> str | None:
    """Why some of this trace's work is in no span: a compiled CPU run without Inductor's kernel profiling."""
    if trace.device != "cpu":
        return None
    names = {e.name for st in trace.steps for e in st.spans}
    compiled = any(map(_compiled_span, names))
    return HIDDEN_CPP if compiled and not any(CPP_KERNEL_RE.search(n) for n in names) else None


def _op(u: Unit) -> Event | None:
    """The CPU op that launched the unit, if the trace says: not a ProfilerStep span around bare launches."""
    return u.op if u.op is not None and not STEP_RE.match(u.op.name) else None


def _key(u: Unit):
    """What align() prefers to agree between two same-name kernels: the launching op and its tensor sizes."""
    op = _op(u)
    return (op.name, repr(_dims(op))) if op is not None else None


# ------------------------------------------------------------------------------ pairing the rest by meaning

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
    for d in _dims(u.op) if u.op is not None else []:
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


def _compiled_span(name: str) -> bool:
    """torch.compile's spans around its code: "Torch-Compiled Region: 0/0", "## Call CompiledFxGraph <hash> ##"."""
    return name.startswith(REGION_PREFIX) or "CompiledFxGraph" in name


def _in_compiled(u: Unit) -> bool:
    """The unit was launched inside compiled code (a span of _compiled_span's around its op, within the step)."""
    e = u.op
    while e is not None and not STEP_RE.match(e.name):
        if _compiled_span(e.name):
            return True
        e = e.parent
    return False


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
        op = _op(units[i])
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
        atom.compiled = atom.compiled or _in_compiled(units[i])
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


# --------------------------------------------------------------------------------------------- the result

def match(a: Trace, b: Trace) -> Comparison:
    """Which kernels stayed, which replaced which, which are gone or new (see the module's docstring)."""
    with _no_gc():
        ua, na = launch_order(a)
        ub, nb = launch_order(b)
        pairs = align([u.name for u in ua], [u.name for u in ub], keys=([_key(u) for u in ua], [_key(u) for u in ub]))
        hidden = (_hidden(a), _hidden(b))
        groups, lone_a, lone_b = _group(ua, ub, pairs, hidden)
        kept: dict[str, tuple[Tally, Tally]] = {}
        for i, j in pairs:
            ta, tb = kept.setdefault(ua[i].name, (Tally(), Tally()))
            ta.add(ua[i])
            tb.add(ub[j])
        ca, cb = _op_calls(a), _op_calls(b)
    return Comparison(
        kept=kept, lone_a=_tally(ua, lone_a), lone_b=_tally(ub, lone_b), groups=groups,
        ops_gone={k: v for k, v in ca.items() if k not in cb},
        ops_new={k: v for k, v in cb.items() if k not in ca},
        steps_used=(na, nb), total_us=(sum(u.us for u in ua), sum(u.us for u in ub)), hidden=hidden,
    )


def _tally(units: list[Unit], positions: list[int]) -> dict[str, Tally]:
    out: dict[str, Tally] = {}
    for i in positions:
        out.setdefault(units[i].name, Tally()).add(units[i])
    return out


def comparison_data(a: Trace, b: Trace) -> dict:
    """The comparison as plain data (what `inspect_trace.py --json A B` prints); compare() renders it as text.

    µs are per step unless the key says per call, over the steps in the typical launch order. Each unit is counted
    once: `same` holds the calls that stayed (`elsewhere`: that name's other calls per step, counted under
    `replaced` or `only_*`); `replaced` entries: A's kernels `old` (one occurrence, in launch order) became B's
    `new`, `times` times per step, `old_us`/`new_us` and `old_calls`/`new_calls` per step; `only_*`: calls nothing
    took the place of. So `kernel_us` = same + replaced + only, per side. `hidden`: why a side's work may be
    missing from its trace (then a group's side is empty). `training`: both traces' phases where both run a
    backward; `communication`: each side's collectives per step, by kind (_comm_side), where either trace is a rank
    of a distributed run or holds a collective, else None.
    """
    m = match(a, b)

    def trace_info(t: Trace) -> dict:
        return {"path": str(t.path), "device": t.device, "device_name": t.device_name, "whole_trace": t.whole,
                "steps": [{"step": st.number, "gpu_busy_us": st.gpu_busy if t.device == "cuda" else None,
                           "cpu_us": st.cpu_time} for st in t.steps]}

    def one(n: str, t: Tally) -> dict:
        return {"name": n, "calls": t.calls, "us_per_call": t.us / t.calls, "us": t.us}

    elsewhere = {side: Counter() for side in "ab"}
    for g in m.groups:
        elsewhere["a"].update(g.calls("old"))
        elsewhere["b"].update(g.calls("new"))
    for side, lone in (("a", m.lone_a), ("b", m.lone_b)):
        elsewhere[side].update({n: t.calls for n, t in lone.items()})
    return {
        "a": trace_info(a), "b": trace_info(b),
        "units": "GPU kernels" if a.device == "cuda" and b.device == "cuda" else "units of work (CPU kernels)",
        "launch_order_steps": {"a": m.steps_used[0], "b": m.steps_used[1]},
        "kernel_us": {"a": m.total_us[0], "b": m.total_us[1]},
        "hidden": {"a": m.hidden[0], "b": m.hidden[1]},
        "same": [{"name": n, "a": one(n, ta), "b": one(n, tb),
                  "elsewhere": {"a": elsewhere["a"][n], "b": elsewhere["b"][n]}} for n, (ta, tb) in m.kept.items()],
        "replaced": [{"old": g.old, "new": g.new, "times": g.times, "old_us": g.old_us, "new_us": g.new_us,
                      "old_calls": g.calls("old"), "new_calls": g.calls("new"),
                      "old_us_per_call": {n: g.old_name_us[n] / c for n, c in g.calls("old").items()},
                      "new_us_per_call": {n: g.new_name_us[n] / c for n, c in g.calls("new").items()},
                      "by": g.by} for g in m.groups],
        "only_a": [one(n, t) for n, t in m.lone_a.items()],
        "only_b": [one(n, t) for n, t in m.lone_b.items()],
        "ops_gone": m.ops_gone, "ops_new": m.ops_new,
        "training": _training(a, b),
        "communication": _communication(a, b),
    }


def _training(a: Trace, b: Trace) -> dict | None:
    """Both traces' training phases (per step, medians: training.phases_summary), where both run a backward."""
    from . import training  # training.py builds on expect.py, which imports report.py: loaded when used

    sides = {"a": training.phases_summary(a), "b": training.phases_summary(b)}
    if None in sides.values():
        return None
    return {side: {k: v for k, v in summary.items() if k != "steps"} for side, summary in sides.items()}


def _communication(a: Trace, b: Trace) -> dict | None:
    """Each trace's collectives per step (mean over its steps), by kind, where either trace has any or says it is a
    rank of a distributed run (DDP against FSDP2, one process against a DDP rank); else None."""
    sides = {"a": _comm_side(a), "b": _comm_side(b)}
    if not any(s["world_size"] > 1 or s["kinds"] for s in sides.values()):
        return None
    return sides


def _comm_side(t: Trace) -> dict:
    """One trace's communication per step: per collective kind its calls, bytes (None where a call's size is not
    in the trace), time and exposed time (with no compute beside it), from ranks.step_work's compute and
    communication intervals and collectives; `total`: all kinds at once (kinds that overlap count once there)."""
    from . import intervals, ranks  # ranks.py builds on expect.py, which imports report.py: loaded when used

    info = t.meta.get("distributedInfo")
    ok = isinstance(info, dict) and type(info.get("world_size")) is int and info["world_size"] >= 1
    world = info["world_size"] if ok else 1
    gpu, n = t.device == "cuda", max(len(t.steps), 1)
    kinds: dict[str, dict] = {}
    total = {"calls": 0, "bytes": 0, "us": 0.0, "exposed_us": 0.0}
    for st in t.steps:
        compute, comm, colls = ranks.step_work(st, gpu, 0.0, world)  # offset 0: the trace's own clock
        for kind in dict.fromkeys(c.kind for c in colls):  # in the order first called
            mine = [c for c in colls if c.kind == kind]
            k = kinds.setdefault(kind, {"calls": 0, "bytes": 0, "us": 0.0, "exposed_us": 0.0})
            k["calls"] += len(mine)
            k["bytes"] = None if k["bytes"] is None or None in (c.bytes for c in mine) else \
                k["bytes"] + sum(c.bytes for c in mine)
            # its calls as far as step_work counts them communication (cut to the step), less what compute hid
            spans = [(c.start, c.end) for c in mine]
            k["us"] += intervals.common(spans, comm)
            k["exposed_us"] += intervals.common(spans, comm + compute) - intervals.common(spans, compute)
        total["calls"] += len(colls)
        total["bytes"] = None if total["bytes"] is None or None in (c.bytes for c in colls) else \
            total["bytes"] + sum(c.bytes for c in colls)
        total["us"] += intervals.length(comm)
        total["exposed_us"] += intervals.length(comm) - intervals.common(comm, compute)
    per_step = lambda d: {key: (v / n if v is not None else None) for key, v in d.items()}  # noqa: E731
    return {"world_size": world, "rank": info.get("rank") if ok else None,
            "backend": info.get("backend") if ok else None, "steps": len(t.steps),
            "kinds": {kind: per_step(v) for kind, v in kinds.items()}, "total": per_step(total)}


# ------------------------------------------------------------------------------------------------ the text

def compare(a: Trace, b: Trace, full_names: bool = False) -> str:
    """The two-trace report, as plain text (A = before, B = after)."""
    return render(comparison_data(a, b), full_names)


def render(d: dict, full_names: bool = False) -> str:
    """comparison_data() as text."""
    def nm(n):
        return short(n, full_names)

    what = d["units"][0].upper() + d["units"][1:]
    da, db = d["a"], d["b"]
    mixed = f" -- note: A is a {da['device']} trace, B a {db['device']} trace" if da["device"] != db["device"] else ""

    def where(t):
        return (t["device_name"] or "GPU") if t["device"] == "cuda" else "CPU"

    def steps(t):  # a trace without ProfilerStep#N spans: its "per step" is the whole trace
        return ("no ProfilerStep spans: one step, the whole trace" if t.get("whole_trace")
                else f"{len(t['steps'])} steps")

    out = [f"A  {da['path']}  ({where(da)}, {steps(da)})",
           f"B  {db['path']}  ({where(db)}, {steps(db)})", ""]
    if bool(da.get("whole_trace")) != bool(db.get("whole_trace")):
        whole = "A" if da.get("whole_trace") else "B"
        out += [f"note: {whole} has no ProfilerStep spans, so its \"per step\" below is per trace; the other's is "
                "per step", ""]
    out += _steps_table(da, db)
    out += _training_lines(d.get("training"), da["device"] == db["device"] == "cuda")
    out += _communication_lines(d.get("communication"))

    na, nb = d["launch_order_steps"]["a"], d["launch_order_steps"]["b"]
    out += ["", f"{what}, time per step: A {_us(d['kernel_us']['a'])} µs, B {_us(d['kernel_us']['b'])} µs "
                f"({na} + {nb} steps in the typical launch order): the sum of what follows, each call counted once"]
    out += ["", f"{what}, same name in both: calls per step, µs per call, µs per step{mixed}"]
    rows = [[nm(s["name"]) + (" *" if s["elsewhere"]["a"] or s["elsewhere"]["b"] else ""),
             f"{s['a']['calls']:g}", f"{s['b']['calls']:g}", _us(s["a"]["us_per_call"]),
             _us(s["b"]["us_per_call"]), _change(s["a"]["us_per_call"], s["b"]["us_per_call"]),
             _us(s["a"]["us"]), _us(s["b"]["us"])] for s in d["same"]]
    headers = ["name", "calls A", "calls B", "µs/call A", "µs/call B", "per call", "µs/step A", "µs/step B"]
    out.append(_table(headers, rows, right=set(range(1, 8))) if rows else "(none)")
    if any(r[0].endswith(" *") for r in rows):
        out.append("* the calls that stayed; this name's other calls are counted below (Replaced, Only in), once")

    out += ["", f"Replaced, paired by what the kernels do (µs per step; {na} + {nb} steps in the typical "
                "launch order):"]
    for r in d["replaced"]:
        out += _replaced(r, d["hidden"], nm)
    if not d["replaced"]:
        out.append("  (none)")
    for label, rows_ in (("Only in A", d["only_a"]), ("Only in B", d["only_b"])):
        out += ["", f"{label}:" + ("" if rows_ else " (none)")]
        out += [f"  {_us(r['us']):>8} µs/step  {r['calls']:g} × {_us(r['us_per_call'])}  {nm(r['name'])}"
                for r in rows_]
    for label, ops in (("CPU ops gone in B", d["ops_gone"]), ("CPU ops new in B", d["ops_new"])):
        out += ["", f"{label}:" + ("" if ops else " (none)")]
        out += [f"  {calls:g}/step  {nm(name)}" for name, calls in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(out)


def _training_lines(t: dict | None, gpu: bool) -> list[str]:
    """Two training steps phase by phase, and each one's optimizer (GPU µs on GPUs, else CPU µs)."""
    if t is None:
        return []
    key, unit = ("gpu_us", "GPU") if gpu else ("cpu_us", "CPU")
    rows = []
    for p in ("forward", "backward", "optimizer"):
        fa, fb = t["a"]["phases"].get(p), t["b"]["phases"].get(p)
        if fa is None or fb is None or fa[key] is None or fb[key] is None:
            continue
        rows.append([p, _us(fa[key]), _us(fb[key]), _change(fa[key], fb[key]),
                     *([f"{fa['kernels']:g}", f"{fb['kernels']:g}"] if gpu else [])])
    out = ["", f"Training step, phase by phase ({unit} µs per step, median over the steps):"]
    out.append(_table(["phase", f"A {unit} µs", f"B {unit} µs", "change", *(["kernels A", "kernels B"] if gpu else [])],
                      rows, right=set(range(1, 6))) if rows else "(no phase in both)")
    for side in "ab":
        o = t[side]["optimizer"]
        if o is not None:
            kernels = f", {o['kernels']:g} kernels" if gpu and o.get("kernels") is not None else ""
            out.append(f"optimizer {side.upper()}: {o['class'] or '?'}, looks {o['implementation']}: "
                       f"{o['ops']:g} ops{kernels} per step")
    return out


def _communication_lines(c: dict | None) -> list[str]:
    """Both traces' collectives per step, kind by kind: calls, bytes, time and the part no compute hid."""
    if c is None:
        return []
    from .memory import _size  # memory.py builds on expect.py, which imports report.py: loaded when used

    def who(s):
        if s["world_size"] <= 1:
            return "one process" + (" (a group of one rank)" if s["backend"] else ", no process group")
        rank = s["rank"] if type(s["rank"]) is int else "?"  # distributedInfo is the trace's word, untrusted
        return f"rank {rank} of {s['world_size']} ({s['backend'] if isinstance(s['backend'], str) else '?'})"

    def size(x):
        return "?" if x is None else _size(x) if x else "0"

    out = ["", f"Communication per step (mean over {c['a']['steps']} + {c['b']['steps']} steps; exposed: no compute "
               f"ran beside it). A: {who(c['a'])}; B: {who(c['b'])}"]
    kinds = list(dict.fromkeys([*c["a"]["kinds"], *c["b"]["kinds"]]))
    none = {"calls": 0, "bytes": 0, "us": 0.0, "exposed_us": 0.0}
    rows = []
    for kind, sides in [(k, [c[s]["kinds"].get(k, none) for s in "ab"]) for k in kinds] + (
            [("total", [c["a"]["total"], c["b"]["total"]])] if len(kinds) > 1 else []):
        x, y = sides
        rows.append([kind, f"{x['calls']:g}", f"{y['calls']:g}", size(x["bytes"]), size(y["bytes"]), _us(x["us"]),
                     _us(y["us"]), _us(x["exposed_us"]), _us(y["exposed_us"])])
    out.append(_table(["collective", "calls A", "calls B", "bytes A", "bytes B", "µs A", "µs B", "exposed µs A",
                       "exposed µs B"], rows, right=set(range(1, 9))) if rows else "(no collectives in either trace)")
    if len(kinds) > 1:
        out.append("total: all kinds at once (where two kinds ran at the same time, that time counts once)")
    return out


def _replaced(r: dict, hidden: dict, nm) -> list[str]:
    """One group: A's side, B's side (or why a side is missing from its trace), µs, calls, the evidence."""
    sides = [_names(r["old"], r["times"], nm) or f"({hidden['a'] or 'nothing'})",
             _names(r["new"], r["times"], nm) or f"({hidden['b'] or 'nothing'})"]
    calls = "; ".join(f"{side} " + (" + ".join(f"{c} × {_us(r[f'{key}_us_per_call'][n])}"
                                               for n, c in r[f"{key}_calls"].items()) or "none")
                      for side, key in (("A", "old"), ("B", "new")))
    if (not r["new"] and hidden["b"]) or (not r["old"] and hidden["a"]):  # no change to state: a side is unseen
        time = f"{_us(r['old_us'])} -> ? µs per step" if r["old"] else f"? -> {_us(r['new_us'])} µs per step"
    else:
        time = f"{_us(r['old_us'])} -> {_us(r['new_us'])} µs per step ({_change(r['old_us'], r['new_us'])})"
    return [f"  {sides[0]}", f"    -> {sides[1]}", f"    {time}, calls × µs: {calls}", f"    paired by: {r['by']}"]


def _names(names: list[str], times: int, nm) -> str:
    counts = Counter(names)
    text = " + ".join(f"{c} × {nm(n)}" if c > 1 else nm(n) for n, c in counts.items())
    return f"{times} × ({text})" if times > 1 and text else text


def _steps_table(da: dict, db: dict, head: int = 3, tail: int = 2) -> list[str]:
    """GPU busy and CPU span per step, side by side; a long run shows its first and last steps and the median."""
    n = max(len(da["steps"]), len(db["steps"]))
    shown = list(range(n)) if n <= head + tail + 1 else list(range(head)) + [None] + list(range(n - tail, n))
    rows = []
    for i in shown:
        cells = []
        for t in (da, db):
            st = t["steps"][i] if i is not None and i < len(t["steps"]) else None
            cells += ["…" if i is None else f"#{st['step']}" if st else "", _us(st["gpu_busy_us"]) if st else "",
                      _us(st["cpu_us"]) if st else ""]
        rows.append(cells)
    for label, f in (("median", statistics.median), ("mean", statistics.fmean)):
        cells = []
        for t in (da, db):
            gpu = [s["gpu_busy_us"] for s in t["steps"] if s["gpu_busy_us"] is not None]
            cpu = [s["cpu_us"] for s in t["steps"]]
            cells += [label, _us(f(gpu)) if gpu else "-", _us(f(cpu)) if cpu else "-"]
        rows.append(cells)
    return [f"Per step (µs): GPU busy and CPU span, side by side ({n} steps)",
            _table(["A step", "A GPU", "A CPU", "B step", "B GPU", "B CPU"], rows, right={1, 2, 4, 5})]


def _change(old: float, new: float) -> str:
    if old <= 0:
        return "new"
    return f"{100 * (new - old) / old:+.0f}%"
