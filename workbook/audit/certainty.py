"""How certain a reverse risk is (:func:`workbook.audit.sites._judge_empty`).

The rule: a reverse risk is **medium** only when every write to the ``empty`` buffer that runs before
its consumer is an unconditional, straight-line (not in a loop) slice write with statically comparable
bounds, some part of the buffer is provably outside all of them (:func:`workbook.audit.regions._gap`),
and the buffer escapes to a consumer the function cannot see (returned, passed on); anything less
certain is **low**, and the finding says why:

* the buffer, or a container literal holding it, is stored into a container that lives in an
  attribute or at module level (``ctx.caches[i] = [k, v, n]``, ``self.pages[slot] = (k, n)``,
  ``self._store["k"] = k``, ``self.entry = (k, v)``, ``_TABLES[key] = {...}``,
  ``self.entries.append((k, n))``): its readers (which may take only the written prefix) are not
  followed, so the trail is lost there (:func:`_kept_in`, as for a buffer kept in an attribute);
* the buffer is handed as a keyword to a constructor or a field replacement (``Batch(slots=buf)``,
  ``dataclasses.replace(b, slots=buf)``): it is kept in the new object's field, as in an attribute,
  and that field's readers are not followed, so the trail is lost there too (:func:`_kept_in_field`);
* a write runs in a loop the allocation is not in (:func:`_writes` lists them all, until the buffer
  is rebound): its passes may cover the rest. ``for i in range(a, b)`` (or ``enumerate(xs)``) that
  writes ``x[..., i + c]`` on every pass (no ``if`` around it, no ``break``) covers ``[a + c, b + c)``
  of that dimension, and tiles ``x[i * k:(i + 1) * k]`` cover ``[a * k, b * k)`` (:func:`_loop_cover`):
  combined with the straight-line writes they may cover the buffer (no finding);
* a write runs under an ``if`` (or a bound of it is a conditional expression): the test may be the
  very one that makes the rest empty, so which part stays unwritten where it matters is not shown;
  unless the writes under tests, taken as if every test held, together with the straight-line ones still
  leave a part unwritten: that part is unwritten on every path, so the gap stands (medium; from the 15th
  check's accelerate ``operations.py:565``). A write under an ``if`` whose test pins a name of the shape
  (``if q == 2:``) is judged on that branch with the size it pins, as before (a proof there);
* a write goes through an index that is neither a slice nor a constant (``kperm[tau] = s``,
  ``x[idx, :] = v``, ``x[mask] = 0``) or through a method that writes where an index tensor or a mask
  points (``x.index_copy_(0, idx, v)``, ``x.scatter_(...)``, ``x.index_put_(...)``): the index may be a
  tensor, so the write may cover any part (a permutation of every index); the finding names it
  (:mod:`workbook.audit.indexing`, which proves no whole write either);
* a dimension's size is picked by a test (``1 if c else 0``, ``n + 1 if extra else n``): on each side
  of the test, the straight-line writes (and, where it holds, those under ``if c:``) may cover the
  buffer or it may be empty (:func:`_by_size_test`). Both sides: written whole or empty, no finding
  (``vp = empty(.., 1 if c else 0)`` with ``if c: vp[..., 0] = ...``); one side: low; neither (a tier
  ``64 if h <= 64 else 128`` written on ``[:h]``): the gap stands.

* the consumer is a Triton launch that loads and stores the buffer and whose stores reach every
  element (:mod:`workbook.audit.rmw_launch`, asked by :func:`workbook.audit.sites._judge_empty` when
  the writes leave the gap standing): it writes the gap before any later use, and whether it reads the
  unwritten values into what it stores is its arithmetic, which the audit does not read.
* the buffer is returned whole, and every caller of the function in the files reads it only through a
  slice, an index, ``narrow`` or ``index_select`` (:mod:`workbook.audit.caller_reads`, asked by
  :func:`workbook.audit.sites._judge_empty` likewise): no caller is shown to read the unwritten part;
  their bounds are not compared with the written part, and callers outside the files are not seen.
  Nor where the whole return runs only under ``if flag:``, a parameter that defaults to false and that
  every call in the files leaves so (:func:`workbook.audit.caller_reads.flag_never_set`).
* the consumer is a Triton launch that loads the buffer only where it stores it and stores a
  ``tl.where`` of the loaded value and a fresh one there, at places the partial writes do not bound: a
  conditional overwrite (:func:`workbook.audit.rmw_launch.rmw_cover`), as a host write under an ``if``.
* the buffer is all-gathered (``dist.all_gather(copies, buf)``) into a list made in the function whose
  copies are read only through slices or indexes (:mod:`workbook.audit.gathered`).

:func:`_certainty` returns the verdict.
"""
from __future__ import annotations

import ast
import copy
import re

from .callees import _is_constructor
from .indexing import _indexed_writer, _unbounded_why
from .regions import _gap, _lin, _norm, _region, _size_on
from .source import _call_name, _control, _dotted, _exclusive, _params, _src, _stmt_of

_KEEPERS = {"append", "extend", "insert", "add", "update", "setdefault", "put", "put_nowait", "__setitem__"}
_CONTAINER = (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Starred)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


# ---- where a buffer handed on is kept -----------------------------------------------------------

def _outlives(target, fn) -> bool:
    """Does the container ``target`` (``self.pages``, ``Ctx.caches``, ``_TABLES``) outlive the
    function: an attribute of anything, or a module-level name (declared ``global`` or never bound in
    the function, nor a parameter)?"""
    while isinstance(target, ast.Subscript):
        target = target.value
    if isinstance(target, ast.Attribute):
        return _dotted(target) is not None
    if not isinstance(target, ast.Name):
        return False
    name = target.id
    if any(isinstance(n, ast.Global) and name in n.names for n in ast.walk(fn.node)):
        return True
    local = any(isinstance(getattr(n, "ctx", None), ast.Store) for n in fn.names.get(name, ()))
    return not local and name not in _params(fn.node) and name != "self"


def _kept_in(node, parents, fn) -> str | None:
    """Where the buffer occurrence ``node`` is stored into a container that outlives the function
    (directly, ``self._store["k"] = buf``, or inside a list/tuple/dict literal, ``ctx.caches[i] = [k,
    v]``, ``self.entry = (k, n)``, ``self.entries.append((k, n))``): that container, or None."""
    e = node
    while isinstance(parents.get(e), _CONTAINER):
        e = parents.get(e)
    par = parents.get(e)
    if isinstance(par, (ast.Assign, ast.AnnAssign)) and par.value is e:
        targets = par.targets if isinstance(par, ast.Assign) else [par.target]
        for t in targets:
            if isinstance(t, ast.Subscript) and _outlives(t, fn):
                return _src(t)
            if e is not node and isinstance(t, ast.Attribute) and _dotted(t):
                return _src(t)
    if isinstance(par, ast.Call) and e in par.args and isinstance(par.func, ast.Attribute) \
            and par.func.attr in _KEEPERS and _outlives(par.func.value, fn):
        return _src(par.func.value)
    return None


def _kept_in_field(fn, var: str, line: int | None) -> str | None:
    """Where the buffer ``var``, used at line ``line``, is handed as a keyword to a constructor or a
    field replacement (``Batch(slots=buf)``, ``dataclasses.replace(b, slots=buf)``): the new object's
    field, ``Batch(...).slots``, which keeps it past this use as an attribute would; or None."""
    if line is None:
        return None
    for call in ast.walk(fn.node):
        if not isinstance(call, ast.Call):
            continue
        for k in call.keywords:
            if k.arg and k.value.lineno == line and _dotted(k.value) == var \
                    and _is_constructor(call, _call_name(call)):
                return f"{_src(call.func)}(...).{k.arg}"
    return None


# ---- the writes of a buffer and what they are under ----------------------------------------------

def _writes(fn, var: str, alloc, known: list, until: int | None) -> list[tuple]:
    """``(statement, slice or None, guards)`` for each write of ``var`` after its allocation ``alloc``
    (until it is rebound) that runs before the consumer at line ``until`` (or in a loop around it):
    ``var[sl] = ...``, ``var[sl].method_(...)``, and the slices ``known`` the analysis saw written;
    ``guards`` are the ``if``/loop/``match`` statements around it that are not around the allocation;
    the slice is None where the write is not one the rules read (``var[i][j] = ...``)."""
    parents = fn.parents
    start = (alloc.end_lineno, alloc.end_col_offset)
    occ = [n for n in fn.names.get(var, ()) if (n.lineno, n.col_offset) > start]
    rebind = min(((n.lineno, n.col_offset) for n in occ if isinstance(getattr(n, "ctx", None), ast.Store)),
                 default=(1 << 30, 0))
    found = {id(k): (k, k, True) for k in known}            # id -> (a node of the write, its slice or None, known)
    for n in occ:
        par = parents.get(n)
        if (n.lineno, n.col_offset) >= rebind:
            continue
        if _indexed_writer(par, parents.get(par)) and par.value is n:
            found.setdefault(id(par), (par, parents.get(par), False))   # var.index_copy_(...): the call
            continue
        if not (isinstance(par, ast.Subscript) and par.value is n):
            continue
        gp, stmt = parents.get(par), _stmt_of(par, parents)
        call = parents.get(gp)
        if isinstance(par.ctx, ast.Store) and isinstance(stmt, (ast.Assign, ast.AnnAssign)) or \
                isinstance(gp, ast.Attribute) and gp.attr.endswith("_") and not gp.attr.startswith("_") \
                and isinstance(call, ast.Call) and call.func is gp:      # var[sl] = ..., var[sl].copy_(...)
            found.setdefault(id(par.slice), (par, par.slice, False))
        elif isinstance(gp, ast.Subscript) and gp.value is par and isinstance(gp.ctx, ast.Store):
            found.setdefault(id(par), (par, None, False))   # var[i][j] = ...: not read
    around = {id(c) for c in _control(alloc, parents)}
    out = []
    for node, sl, seen in found.values():
        stmt = _stmt_of(node, parents)
        if stmt is None or _exclusive(alloc, stmt, parents):
            continue
        guards = [c for c in _control(stmt, parents) if id(c) not in around and not isinstance(c, ast.Try)]
        loops = [g for g in guards if isinstance(g, _LOOPS)]
        if not seen and until is not None and stmt.lineno >= until and \
                not any(g.lineno <= until <= g.end_lineno for g in loops):
            continue                  # at or after the consumer, not in a loop around it: it saw the buffer before
        out.append((stmt, sl, guards))
    return sorted(out, key=lambda w: (w[0].lineno, w[0].col_offset))


def _pins(test, shape) -> bool:
    """``if q == 2:`` where ``q`` names a size of the allocation: the branch is judged with q pinned."""
    names = {n.id for e in shape or () for n in ast.walk(e) if isinstance(n, ast.Name)}
    return isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq) \
        and isinstance(test.left, ast.Name) and test.left.id in names \
        and isinstance(test.comparators[0], ast.Constant) and isinstance(test.comparators[0].value, int)


def _in_body(stmt, node, parents) -> bool:
    n = stmt
    while n is not None and parents.get(n) is not node:
        n = parents.get(n)
    return n is not None and any(n is c for c in node.body)


# ---- loops whose passes cover a range --------------------------------------------------------------

def _subst(e, name: str, value):
    """A copy of ``e`` with the name ``name`` replaced by the expression ``value``."""
    class _Sub(ast.NodeTransformer):
        def visit_Name(self, n):
            return copy.deepcopy(value) if n.id == name else n
    return _Sub().visit(copy.deepcopy(e))


def _range_of(loop) -> tuple | None:
    """``(index name, first, end)`` of ``for i in range(a, b)`` / ``range(b)`` / ``enumerate(xs)``."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not isinstance(loop.iter, ast.Call) \
            or not isinstance(loop.iter.func, ast.Name) or loop.iter.keywords:
        return None
    it, target = loop.iter, loop.target
    if it.func.id == "range" and isinstance(target, ast.Name) and 1 <= len(it.args) <= 2:
        first = it.args[0] if len(it.args) == 2 else ast.Constant(0)
        return target.id, first, it.args[-1]
    if it.func.id == "enumerate" and len(it.args) == 1 and isinstance(target, ast.Tuple) and target.elts \
            and isinstance(target.elts[0], ast.Name):
        size = ast.Call(func=ast.Name("len", ast.Load()), args=[it.args[0]], keywords=[])
        return target.elts[0].id, ast.Constant(0), size
    return None


def _loop_cover(sl, loop, env: dict) -> ast.AST | None:
    """The slice ``sl`` written on every pass of ``loop`` as the slice of the range its passes cover
    (``x[:, i + 1]`` for ``i in range(s)``: ``x[:, 1:s + 1]``; tiles ``x[i * k:(i + 1) * k]``:
    ``x[0 * k:n * k]``), or None (another loop, an index it does not place, a ``break``)."""
    rng = _range_of(loop)
    if rng is None or any(isinstance(n, ast.Break) for st in loop.body for n in ast.walk(st)):
        return None
    i, first, end = rng
    reg = _region(sl, {})
    elts = list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]
    hit = [k for k, e in enumerate(elts) if any(isinstance(n, ast.Name) and n.id == i for n in ast.walk(e))]
    if reg is None or reg[0] == "whole" or len(hit) != 1:
        return None
    e = elts[hit[0]]
    if isinstance(e, ast.Slice):
        if e.step is not None or e.lower is None or e.upper is None:
            return None
        nxt = _subst(e.lower, i, ast.BinOp(ast.Name(i, ast.Load()), ast.Add(), ast.Constant(1)))
        if _norm(e.upper, env) != _norm(nxt, env):
            return None                                      # the tiles do not chain
        lo, hi = _subst(e.lower, i, first), _subst(e.lower, i, end)
    else:
        terms, _ = _lin(e, env)
        if terms.get(i) != 1 or any(t != i and re.search(rf"\b{i}\b", t) for t in terms):
            return None                                      # not i + c: the passes are not consecutive
        lo, hi = _subst(e, i, first), _subst(e, i, end)
    out = list(elts)
    out[hit[0]] = ast.Slice(lower=lo, upper=hi)
    return ast.Tuple(out, ast.Load()) if isinstance(sl, ast.Tuple) else out[0]


# ---- a size chosen by a test ------------------------------------------------------------------

def _test_sizes(shape, env: dict):
    """``(dim, size, test, size on the test's true side, on its false side)`` for each dimension whose
    size (through names assigned once) holds a conditional expression (``1 if c else 0``, ``n + 1 if
    extra else n``, ``n + (1 if c else 0)``)."""
    for dim, size in enumerate(shape or ()):
        e, depth = size, 3
        while isinstance(e, ast.Name) and depth > 0 and e.id in env:
            e, depth = env[e.id], depth - 1
        ifexp = next((n for n in ast.walk(e) if isinstance(n, ast.IfExp)), None)
        if ifexp is None:
            continue
        text, sub = _src(e), _src(ifexp)
        if sub not in text:
            continue
        sides = [ast.parse(text.replace(sub, f"({_src(b)})", 1), mode="eval").body for b in (ifexp.body, ifexp.orelse)]
        yield dim, size, ifexp.test, sides[0], sides[1]


def _by_size_test(writes: list, plain: list, shape, env: dict, parents) -> tuple[str | None, str | None]:
    """A dimension whose size a test picks: on each side of the test, do the straight-line writes
    (and, where it holds, those under ``if`` the same test) cover the buffer, or is it empty? Both
    sides: ``("covered", why)`` (``1 if c else 0`` written ``[..., 0]`` under ``if c:``); one side:
    ``("low", why)`` (the test may be the one that makes the rest empty); neither: ``(None, None)``."""
    for dim, size, test, yes, no in _test_sizes(shape, env):
        same = [sl for st, sl, guards in writes if sl is not None and guards and all(
            isinstance(g, ast.If) and _src(g.test) == _src(test) and _in_body(st, g, parents) for g in guards)]
        covered = []
        for side, extra in ((yes, same), (no, [])):
            whole = list(shape)
            whole[dim] = side
            covered.append(_norm(side, env) == "0" or
                           bool(plain + extra) and _gap(plain + extra, whole, None, env)[0] is None)
        if all(covered):
            return "covered", f"dimension {dim} is sized by {_src(test)} and written whole where it holds"
        if any(covered):
            where = "holds" if covered[0] else "fails"
            return "low", (f"the size of dimension {dim} is chosen by a test ({_src(size)}: {_src(test)}); where it "
                           f"{where}, the writes cover the buffer or it is empty")
    return None, None


# ---- the verdict --------------------------------------------------------------------------------

def _certainty(fn, alloc, var: str, shape, env: dict, regions: list, until: int | None) -> tuple[str | None, str | None]:
    """``("covered", why)``: the writes, loops and sizes a test picks read together cover the buffer
    (no finding); ``("low", why)``: a write runs in a loop or under a condition, or a size is picked
    by a test, so the gap is not proven; ``(None, None)``: every write is straight-line (medium stands)."""
    writes = _writes(fn, var, alloc, regions, until)
    parents = fn.parents
    plain, why, conditional, other = [], None, [], False   # other: a doubt besides bounded writes under an if
    for st, sl, guards in writes:
        loops = [g for g in guards if isinstance(g, _LOOPS)]
        conds = [g for g in guards if not isinstance(g, _LOOPS)
                 and not (isinstance(g, ast.If) and _pins(g.test, shape) and _in_body(st, g, parents))]
        if sl is None:
            why, other = why or f"{_src(st)[:80]} (line {st.lineno}) is a write the audit does not place", True
        elif isinstance(sl, ast.Call):            # var.scatter_(...): no part placed, any part may be written
            why, other = why or _unbounded_why(st, sl, env), True
        elif loops:
            other = True
            cover = _loop_cover(sl, loops[-1], env) if len(loops) == 1 and not conds else None
            if cover is not None:
                plain.append(cover)
            why = why or (f"written in the loop at line {loops[-1].lineno} ({_src(st)[:80]}): its passes may cover "
                          "more than the audit holds as certain" if cover is not None else
                          f"written under a loop at line {loops[-1].lineno} with an index the audit does not bound "
                          f"({_src(st)[:80]}): its passes may cover the rest")
        elif conds:
            why = why or (f"written under a condition ({_cond_text(conds[-1])}, line {conds[-1].lineno}): "
                          "the audit cannot show which part stays unwritten where it holds or fails")
            bounded = not any(isinstance(n, ast.IfExp) for n in ast.walk(sl)) and _unbounded_why(st, sl, env) is None
            conditional.append(sl) if bounded else None
            other = other or not bounded
        else:
            if any(isinstance(n, ast.IfExp) for n in ast.walk(sl)):
                why, other = why or (f"a bound of {_src(st)[:80]} (line {st.lineno}) is a conditional expression: "
                                     "which part stays unwritten depends on it"), True
            unbounded = _unbounded_why(st, sl, env)      # var[idx] = ...: it may write the rest
            why, other = why or unbounded, other or unbounded is not None
            plain.append(sl)
    placed = [w for w in writes if not isinstance(w[1], ast.Call)]
    verdict, size_why = _by_size_test(placed, plain, shape, env, parents)
    if verdict == "covered" or plain and _gap(plain, shape, None, env)[0] is None:
        return "covered", size_why or "the writes, loops included, cover every element"
    if why and not other and not size_why and conditional and _gap_on_every_path(plain + conditional, shape, env):
        return None, None    # a part no write reaches even where every test holds: unwritten on every path
    why = why or size_why
    return ("low", why) if why else (None, None)


def _gap_on_every_path(slices: list, shape, env: dict) -> bool:
    """Whether the writes ``slices`` (the straight-line ones and those under tests, as if every test held)
    leave a part of a dimension of constant size unwritten (``empty(1 << 20)`` written on ``[:len(s) + 1]``):
    a size that is an expression of names or calls (``_out_elems(dtype)``) may be exactly what is written."""
    if not all(_gap(slices, shape, None, env)):
        return False
    regions = [_region(s, env) for s in slices]
    size = _size_on(shape, regions[0][0], None, env) if regions and regions[0] else None
    return bool(size) and re.fullmatch(r"[\d\s()+*\-/<%]+", size) is not None


def _cond_text(g) -> str:
    test = getattr(g, "test", None) or getattr(g, "subject", None)
    return f"if {_src(test)}" if isinstance(g, ast.If) else _src(test) if test is not None else type(g).__name__
