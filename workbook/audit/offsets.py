"""Does a Triton store's address reach element 0 and every stride of the buffer it writes? (used by
:mod:`workbook.audit.kernel_use` for each direct ``tl.store`` through a pointer parameter).

The address is expanded, through the kernel's assignments, into a sum of terms (a polynomial): each
term is an integer times a product of atoms. Index atoms are what varies over the elements one launch
writes: a ``tl.arange`` (with its broadcast, ``[:, None]``), a program id, a loop variable (a ``range``
loop's variable is its start plus an atom that runs from 0), and any opaque value computed from them
or from memory (``//``, ``%``, ``tl.load``, a call); every other name or opaque value is a factor of
the term's *stride* (the non-index atoms: ``M``, ``stride_yr``, ``BLOCK``). The pointer parameter
itself is the base and drops out. Pointer arithmetic a loop repeats (``p += BLOCK`` in a loop) is an
advance, not a start, and is left out; a name assigned in both branches of an ``if`` is read as
either (the address is judged under each, and only an address that misses elements under every
reading counts), and an expansion with too many readings is left undecided (not judged).

An address does not prove that the store reaches the whole buffer when, for some stride:

* *a shift*: the terms without an index atom add up to ``c > 0`` steps of a stride along which a
  ``tl.arange`` or a loop variable runs, or a program id runs bare (stride 1) (``cumsum + 1 + offs``,
  ``1 + tl.arange``, a loop ``range(1, n)``, a base moved by one stride: ``y += stride_yr`` before
  ``off_r * stride_yr``): indexes ``[0, c)`` of that dimension are never stored. A whole block
  (``(pid + 1) * BLOCK``: one step of the stride ``BLOCK``, along which only the program id runs) is a
  choice of blocks, not a shift;
* *a diagonal*: one index atom runs along two strides and no other index runs along either
  (``row * M + col`` with ``col = row + k``, ``i * (N + 1)``): only a diagonal is stored, the elements
  off it never are. ``pid * (S + 1) + tl.arange(0, S + 1)`` is rows of ``S + 1`` (the arange runs
  along the program id's stride 1), not a diagonal;
* *a program id added to an arange*: a program id in one term only, times 1, on the stride of a
  ``tl.arange`` (``pid_y + tl.arange(0, BLOCK_N)`` where ``pid_y * BLOCK_N + ...`` is the tile): the
  programs' ranges overlap and, once the axis is longer than a block, the tail past the last
  program's block is never stored.

:func:`store_extent` says how far an address made only of constants and literal ``tl.arange`` terms
reaches (``B + tl.arange(0, 64)``: 64 elements), for a launch of one program to be held against the
buffer's literal size (:mod:`workbook.audit.padded_launch`).

:func:`store_gap` returns the reason, worded like the audit's other low notes (what is never stored
keeps what was there), or ``None`` when the address shows none of these. A kernel whose *every*
store of a parameter shows one is judged to store part of it (:mod:`workbook.audit.kernel_use`);
another store that reaches the rest (``tl.store(out, 0)`` beside ``out + 1 + offs``) keeps the claim."""
from __future__ import annotations

import ast
from collections import defaultdict

from .source import _call_name

_INDEX = {"arange", "pid", "loop", "xopaque"}
_RUNS = {"arange", "loop", "pid"}
_TRANSPARENT = {"multiple_of", "max_contiguous", "to", "cast"}
_LOOPS = (ast.For, ast.While)
_MAX_ALTS = 16
_MAX_DEPTH = 10


def _mul(p: dict, q: dict) -> dict:
    out: dict = defaultdict(int)
    for m1, c1 in p.items():
        for m2, c2 in q.items():
            out[tuple(sorted(m1 + m2))] += c1 * c2
    return {m: c for m, c in out.items() if c}


def _add(p: dict, q: dict, sign: int = 1) -> dict:
    out: dict = defaultdict(int, p)
    for m, c in q.items():
        out[m] += sign * c
    return {m: c for m, c in out.items() if c}


def _combine(alts_a, alts_b, f):
    if alts_a is None or alts_b is None or len(alts_a) * len(alts_b) > _MAX_ALTS:
        return None
    return [f(a, b) for a in alts_a for b in alts_b]


def _atom(kind: str, ident: str, tag: str = "") -> list[dict]:
    return [{((kind, ident, tag),): 1}]


def _tagged(alts, tag: str):
    """The broadcast ``[:, None]`` applied to the index atoms that run (another dimension of the tile)."""
    if alts is None:
        return None
    return [{tuple(sorted((k, i, t + tag) if k in _RUNS else (k, i, t) for k, i, t in m)): c for m, c in p.items()}
            for p in alts]


class _Address:
    """One kernel's address expressions, expanded (see the module docstring); ``base`` is the set of
    names that stand for the stored pointer when they have no reaching assignment."""

    def __init__(self, fn, base: set):
        self.fn, self.base, self.show = fn, base, {}
        self.extent: dict[str, int] = {}                  # arange ident -> its length, where both ends are literal
        self.defs: dict[str, list] = defaultdict(list)    # name -> (statement, value or None, kind)
        for n in ast.walk(fn.node):
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                    if isinstance(t, ast.Name):
                        self.defs[t.id].append((n, n.value, "assign"))
                    else:
                        for x in ast.walk(t):
                            if isinstance(x, ast.Name):
                                self.defs[x.id].append((n, None, "opaque"))
            elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
                value = ast.BinOp(ast.Name(n.target.id, ast.Load()), n.op, n.value)
                self.defs[n.target.id].append((n, value, "assign"))
            elif isinstance(n, ast.For):
                for x in ast.walk(n.target):
                    if isinstance(x, ast.Name):
                        self.defs[x.id].append((n, n.iter if isinstance(n.target, ast.Name) else None, "for"))

    def _path(self, node) -> tuple[list, set]:
        """The ``if`` branches (if id, 'body'/'orelse') around ``node``, outermost first, and its loops."""
        branches, loops, child, p = [], set(), node, self.fn.parents.get(node)
        while p is not None and p is not self.fn.node:
            if isinstance(p, ast.If) and child is not p.test:
                branches.append((id(p), "body" if any(child is s for s in p.body) else "orelse"))
            if isinstance(p, _LOOPS):
                loops.add(id(p))
            child, p = p, self.fn.parents.get(p)
        return branches[::-1], loops

    def _reaching(self, name: str, at) -> list:
        """The assignments of ``name`` that may reach the statement ``at`` (see the module docstring)."""
        where, loops = self._path(at)
        cands = []
        for st, value, kind in self.defs.get(name, ()):
            if kind == "for":
                if id(st) in loops:
                    cands.append((st, value, kind))
                continue
            if st.lineno >= at.lineno:
                continue
            d_where, d_loops = self._path(st)
            if any(b != a for (i, b) in d_where for (j, a) in where if i == j):
                continue                                  # the other branch of an if around ``at``
            if d_loops and value is not None and name in {x.id for x in ast.walk(value) if isinstance(x, ast.Name)}:
                continue                                  # p = p + BLOCK in a loop: an advance
            cands.append((st, value, kind))
        killed = {id(d[0]) for d in cands for e in cands
                  if e[0].lineno > d[0].lineno and self._path(e[0])[0] == where[:len(self._path(e[0])[0])]}
        return [d for d in cands if id(d[0]) not in killed]

    def poly(self, e, at, depth: int = 0):
        """The readings of expression ``e`` (in statement ``at``) as polynomials, or None (undecided)."""
        if depth > _MAX_DEPTH:
            return None
        if isinstance(e, ast.Constant):
            if isinstance(e.value, (bool, int)):
                return [{(): int(e.value)} if e.value else {}]
            return _atom("name", repr(e.value))
        if isinstance(e, ast.Name):
            return self._name(e.id, at, depth)
        if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = self.poly(e.left, at, depth + 1), self.poly(e.right, at, depth + 1)
            if isinstance(e.op, ast.Mult):
                return _combine(a, b, _mul)
            return _combine(a, b, lambda p, q: _add(p, q, -1 if isinstance(e.op, ast.Sub) else 1))
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
            a = self.poly(e.operand, at, depth + 1)
            return a if a is None or isinstance(e.op, ast.UAdd) else [{m: -c for m, c in p.items()} for p in a]
        if isinstance(e, ast.IfExp):
            a, b = self.poly(e.body, at, depth + 1), self.poly(e.orelse, at, depth + 1)
            return None if a is None or b is None or len(a) + len(b) > _MAX_ALTS else a + b
        if isinstance(e, ast.Subscript) and _broadcast(e.slice):
            return _tagged(self.poly(e.value, at, depth + 1), ast.unparse(e.slice))
        if isinstance(e, ast.Call):
            return self._call(e, at, depth)
        return self._opaque(e, at, depth)

    def _name(self, name: str, at, depth: int):
        defs = self._reaching(name, at)
        if not defs:
            return _atom("base" if name in self.base else "name", name)
        out = []
        for st, value, kind in defs:
            if value is None:
                return _atom("xopaque", name)
            alts = self._loop(name, st, depth) if kind == "for" else self.poly(value, st, depth + 1)
            if alts is None or len(out) + len(alts) > _MAX_ALTS:
                return None
            out += alts
        for p in out:     # a name for one run (off_r = tl.arange(...), pid_y = tl.program_id(1)): show it
            if len(p) == 1 and list(p.values()) == [1] and len(m := next(iter(p))) == 1 and m[0][0] in _RUNS:
                self.show.setdefault(m[0][1], name)
        return out

    def _loop(self, name: str, st, depth: int):
        """A loop variable: its ``range`` start plus an atom that runs from 0 (other iterables: opaque)."""
        it = st.iter
        if not (isinstance(it, ast.Call) and _call_name(it) in ("range", "static_range") and it.args):
            return _atom("xopaque", name)
        start = self.poly(it.args[0], st, depth + 1) if len(it.args) > 1 else [{}]
        self.show.setdefault(f"{name}@{st.lineno}", name)
        return _combine(start, _atom("loop", f"{name}@{st.lineno}"), _add)

    def _call(self, e: ast.Call, at, depth: int):
        name = _call_name(e)
        if name == "arange" and len(e.args) == 2:
            ident = str(id(e))
            self.show.setdefault(ident, ast.unparse(e))
            if all(isinstance(a, ast.Constant) and type(a.value) is int for a in e.args):
                self.extent[ident] = e.args[1].value - e.args[0].value
            size = ast.unparse(ast.BinOp(e.args[1], ast.Sub(), e.args[0])) if not _is_zero(e.args[0]) \
                else ast.unparse(e.args[1])
            return _combine(self.poly(e.args[0], at, depth + 1), _atom("arange", ident, ""), _add) \
                if size != "1" else _atom("xopaque", ident)
        if name == "program_id":
            axis = e.args[0] if e.args else next((k.value for k in e.keywords if k.arg == "axis"), None)
            if isinstance(axis, ast.Constant):
                return _atom("pid", str(axis.value))
        if name in _TRANSPARENT:
            inner = e.func.value if name == "to" and isinstance(e.func, ast.Attribute) else (e.args or [None])[0]
            if inner is not None:
                return self.poly(inner, at, depth + 1)
        return self._opaque(e, at, depth)

    def _opaque(self, e, at, depth: int):
        """A value the polynomial does not model: an index atom when it depends on one (or on memory)."""
        if isinstance(e, ast.Call) and _call_name(e) in ("load", "program_id", "arange", "num_programs"):
            return _atom("xopaque", ast.unparse(e))
        for sub in ast.iter_child_nodes(e):
            if isinstance(sub, ast.expr) and not isinstance(sub, ast.Constant):
                alts = self.poly(sub, at, depth + 1)
                if alts is None or any(a[0] in _INDEX for p in alts for m in p for a in m):
                    return _atom("xopaque", ast.unparse(e))
        return _atom("name", ast.unparse(e))


def _broadcast(sl) -> bool:
    """Is a subscript only a broadcast (``[:, None]``, ``[None, :]``)?"""
    elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
    new_axis = [isinstance(x, ast.Constant) and x.value is None for x in elts]
    whole = [isinstance(x, ast.Slice) and x.lower is None and x.upper is None and x.step is None for x in elts]
    return any(new_axis) and all(a or w for a, w in zip(new_axis, whole))


def _is_zero(e) -> bool:
    return isinstance(e, ast.Constant) and e.value == 0


def _stride(key: tuple) -> str:
    return " * ".join(i for _, i, _ in key) or "1"


def _gap(p: dict, show: dict) -> tuple[str, str] | None:
    """Which part of the buffer the address ``p`` (one reading) never reaches, and what in the address
    says so; None when it shows no gap."""
    terms = []
    for m, c in p.items():
        if not any(a[0] == "base" for a in m):
            terms.append(([a for a in m if a[0] in _INDEX], tuple(a for a in m if a[0] not in _INDEX), c))
    rests: dict = defaultdict(set)       # run atom -> the strides (the rest of each term) it runs along
    for idx, key, c in terms:
        for a in idx:
            if a[0] in _RUNS:
                rest = idx + list(key)
                rest.remove(a)
                rests[a].add(tuple(sorted(rest)))
    return _shift(terms, show) or _diagonal(rests, show) or _pid_added(terms, rests, show)


def _shift(terms: list, show: dict):
    """Terms without an index atom adding up to ``c > 0`` steps of a stride a run goes along."""
    shift: dict = defaultdict(int)
    for idx, key, c in terms:
        if not idx:
            shift[key] += c
    for key, c in shift.items():
        run = next((i[0] for i, k, ci in terms if len(i) == 1 and k == key and ci > 0 and
                    (i[0][0] in ("arange", "loop") or i[0][0] == "pid" and not key)), None)
        if c > 0 and run is not None:
            along = f" along stride {_stride(key)}" if key else ""
            part = f"index 0{along} is never stored and keeps" if c == 1 else \
                f"indexes [0, {c}){along} are never stored and keep"
            return f"{part} what was there", f"runs {show.get(run[1], run[1])} from {c}, not 0"
    return None


def _diagonal(rests: dict, show: dict):
    """A run along two strides, neither of which another run goes along (``i * (N + 1)``; not
    ``pid * (S + 1) + tl.arange(0, S + 1)``, rows of S + 1)."""
    for a, rs in sorted(rests.items(), key=lambda kv: ("arange", "loop", "pid").index(kv[0][0])):
        if len(rs) > 1 and not any(rs & other for b, other in rests.items() if b != a):
            strides = " and ".join(sorted(_stride(r) for r in rs)[:2])
            name = show.get(a[1], f"tl.program_id({a[1]})" if a[0] == "pid" else a[1])
            return "only a diagonal is stored, the elements off it keep what was there", \
                f"steps {name} along two strides at once ({strides})"
    return None


def _pid_added(terms: list, rests: dict, show: dict):
    """A program id in one term only, added (times 1) to a ``tl.arange`` along the same stride."""
    for idx, key, c in terms:
        if len(idx) == 1 and idx[0][0] == "pid" and c == 1 and len(rests[idx[0]]) == 1:
            ar = next((i[0] for i, k, _ in terms if len(i) == 1 and i[0][0] == "arange" and k == key), None)
            if ar is not None:
                pid = show.get(idx[0][1], f"tl.program_id({idx[0][1]})")
                return "the elements past the last program's block keep what was there", \
                    f"adds program id {pid} to {show.get(ar[1], ar[1])}, not {pid} * block (on an axis longer " \
                    "than a block the programs' ranges overlap and stop short)"
    return None


def store_gap(fn, ptr, base: set) -> str | None:
    """The reason the ``tl.store`` address ``ptr`` in kernel ``fn`` does not reach the whole buffer
    (under every reading of its names), or None; ``base``: the pointer parameter and its local copies."""
    addr = _Address(fn, base)
    at = ptr
    while at is not None and not isinstance(at, ast.stmt):
        at = fn.parents.get(at)
    if at is None:
        return None
    alts = addr.poly(ptr, at)
    if not alts:
        return None
    gaps = [_gap(p, addr.show) for p in alts]
    if not all(gaps):
        return None
    text = ast.unparse(ptr)
    head, detail = gaps[0]
    return f"{head}: its store address ({text if len(text) <= 60 else text[:57] + '...'}) {detail}"


def store_extent(fn, ptr, base: set) -> tuple[int, str] | None:
    """How many elements from the base the ``tl.store`` address ``ptr`` in kernel ``fn`` can reach (its
    largest index plus one, under every reading), and the address as written, when it is made only of
    constants and ``tl.arange`` terms of literal extent (``B + tl.arange(0, 64)``): no program id, no
    loop variable, no name; else None (what it reaches depends on the launch)."""
    addr = _Address(fn, base)
    at = ptr
    while at is not None and not isinstance(at, ast.stmt):
        at = fn.parents.get(at)
    alts = addr.poly(ptr, at) if at is not None else None
    if not alts:
        return None
    reach = 0
    for p in alts:
        top = 0
        for m, c in p.items():
            if any(a[0] == "base" for a in m):
                continue
            if not m:
                top += c
            elif len(m) == 1 and m[0][0] == "arange" and m[0][1] in addr.extent and c > 0:
                top += c * (addr.extent[m[0][1]] - 1)
            else:
                return None
        if top < 0:
            return None
        reach = max(reach, top + 1)
    text = ast.unparse(ptr)
    return reach, text if len(text) <= 60 else text[:57] + "..."
