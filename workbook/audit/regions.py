"""Which part of a buffer a set of subscript writes covers, read from the writes' slices and the
allocation's shape (:func:`_alloc_shape`, :func:`_region`, :func:`_gap`), and where an allocation's
size came from (:func:`_padding`).

A write ``x[sl] = ...`` (or a writer given ``x[sl]``) is a *region*: it restricts one dimension and
takes the others whole (``x[:k]``, ``x[:, 0]``, ``x[..., h:]``, ``x[1::2]``, ``x[0]``). Regions on the
same dimension cover it when their bounds chain from 0 to the end (``[:k]`` + ``[k:]``, ``[0]`` +
``[1:]``, ``[:a]`` + ``[a:b]`` where ``b`` is the allocated size as written) or when their strided
starts are every residue (``0::2`` + ``1::2``); an index chain ending at a literal size (``[:, 0]``
+ ``[:, 1]`` of ``empty(n, 2)``) covers it too. Bounds are compared as written (``n`` equals ``n``,
never ``m``); nothing else is assumed. :func:`_gap` names what is left: a part *provably* unwritten
(an index of a literal-sized dimension nobody writes) or *not shown* written (``[:n]`` of a buffer of
``x.shape[0]`` rows).
"""
from __future__ import annotations

import ast
import re

from .source import _call_name, _dotted, _src

_PAD_NAME = re.compile(r"round_up|roundup|cdiv|ceil|align|pad|next_power_of_2|next_multiple|multiple_of",
                       re.IGNORECASE)
_SHAPE_ARG0 = {"empty", "zeros", "ones", "full", "empty_strided", "new_empty", "new_zeros", "new_full", "new_ones",
               "randn", "rand"}


def _alloc_shape(call: ast.AST | None) -> list | None:
    """The allocation's sizes as expressions (``torch.empty(n, 2)``, ``torch.empty((n, 2))``,
    ``x.new_zeros([n, 2])``, ``size=(n, 2)``), or None (``*_like``, a shape held in a variable)."""
    if not isinstance(call, ast.Call) or _call_name(call) not in _SHAPE_ARG0:
        return None
    size = next((k.value for k in call.keywords if k.arg == "size"), None)
    name = _call_name(call)
    if size is None and call.args:
        first = call.args[0]
        if isinstance(first, (ast.Tuple, ast.List)) or name in ("full", "new_full", "empty_strided") \
                or len(call.args) == 1:
            size = first
        else:                                       # torch.empty(n, 2, ...): every positional is a size
            return list(call.args)
    if isinstance(size, (ast.Tuple, ast.List)):
        return None if any(isinstance(e, ast.Starred) for e in size.elts) else list(size.elts)
    if size is not None and not isinstance(size, ast.Starred):
        if isinstance(size, ast.Attribute) and size.attr == "shape":
            return None                             # torch.empty(x.shape): the dims are not written out
        return [size]
    return None


def _lin(e, env: dict, depth: int = 3) -> tuple[dict, int]:
    """``e`` as a sum of terms with integer coefficients plus a constant, names replaced by the one
    value the function assigns them (``env``, up to ``depth`` steps) and ``len(a + b)`` split into
    ``len(a) + len(b)``: two bounds are equal when their sums are."""
    if isinstance(e, ast.Constant) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return {}, e.value
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
        t, c = _lin(e.operand, env, depth)
        return {k: -v for k, v in t.items()}, -c
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
        (t1, c1), (t2, c2) = _lin(e.left, env, depth), _lin(e.right, env, depth)
        sign = 1 if isinstance(e.op, ast.Add) else -1
        t = dict(t1)
        for k, v in t2.items():
            t[k] = t.get(k, 0) + sign * v
        return {k: v for k, v in t.items() if v}, c1 + sign * c2
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
        (t1, c1), (t2, c2) = _lin(e.left, env, depth), _lin(e.right, env, depth)
        if not t1 or not t2:
            k, (t, c) = (c1, (t2, c2)) if not t1 else (c2, (t1, c1))
            return {a: k * v for a, v in t.items() if k * v}, k * c
    if isinstance(e, ast.Name) and depth > 0 and e.id in env:
        return _lin(env[e.id], env, depth - 1)
    if isinstance(e, ast.Call) and _call_name(e) == "len" and len(e.args) == 1 and isinstance(e.func, ast.Name):
        x = e.args[0]
        v = env.get(x.id) if isinstance(x, ast.Name) and depth > 0 else None
        if isinstance(v, ast.BinOp) and isinstance(v.op, ast.Add):
            parts = [ast.Call(func=ast.Name("len", ast.Load()), args=[side], keywords=[]) for side in (v.left, v.right)]
            (t1, c1), (t2, c2) = (_lin(p, env, depth - 1) for p in parts)
            t = dict(t1)
            for k, n in t2.items():
                t[k] = t.get(k, 0) + n
            return t, c1 + c2
    return {_src(e): 1}, 0


def _norm(e, env: dict | None = None, plus: int = 0) -> str:
    """A bound as text: '' for absent, integers canonical, sums in one order (see :func:`_lin`)."""
    if e is None:
        return ""
    terms, const = _lin(e, env or {}, 3 if env else 0)
    const += plus
    parts = [a if c == 1 else f"{c}*{a}" for a, c in sorted(terms.items())]
    if const or not parts:
        parts.append(str(const))
    return " + ".join(parts).replace("+ -", "- ")


def _env(stmts: list, names: dict, consts: dict | None = None) -> dict:
    """{name: its value} for the names a function assigns exactly once (``a = ...``, ``a, b = x, y``),
    and the module-level integer constants ``consts`` (:func:`workbook.audit.source._module_constants`)
    of the names it does not assign."""
    cand = {}
    for st in stmts:
        if isinstance(st, ast.Assign) and len(st.targets) == 1:
            t = st.targets[0]
            if isinstance(t, ast.Name):
                cand[t.id] = st.value
            elif isinstance(t, ast.Tuple) and isinstance(st.value, ast.Tuple) and len(t.elts) == len(st.value.elts):
                cand.update({k.id: v for k, v in zip(t.elts, st.value.elts) if isinstance(k, ast.Name)})
    env = {k: ast.Constant(v) for k, v in (consts or {}).items()
           if not any(isinstance(getattr(n, "ctx", None), ast.Store) for n in names.get(k, ()))}
    env.update({k: v for k, v in cand.items()
                if sum(isinstance(getattr(n, "ctx", None), ast.Store) for n in names.get(k, ())) == 1})
    return env


def _region(sl, env: dict | None = None) -> tuple | None:
    """``(dim, spec)`` for a slice that restricts one dimension (``dim`` counts from the front, or
    from the back, negative, after an ``...``); ``spec`` is ``('range', lo, hi)`` or ``('step', start,
    step)``. ``('whole', None)`` when nothing is restricted; None when several dims are, or for an
    index the rules do not read (a negative one, a tensor)."""
    elts = list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]
    ell = [i for i, e in enumerate(elts) if isinstance(e, ast.Constant) and e.value is Ellipsis]
    if len(ell) > 1:
        return None
    found = None
    for i, e in enumerate(elts):
        if ell and i == ell[0]:
            continue
        if isinstance(e, ast.Slice) and e.lower is None and e.upper is None and e.step is None:
            continue
        if found is not None:
            return None                             # a box over two dims: not read
        dim = i if not ell or i < ell[0] else i - len(elts)
        spec = _spec(e, env)
        if spec is None:
            return None
        found = (dim, spec)
    return found or ("whole", None)


def _negative(e) -> bool:
    """A bound written negative (``-1``, ``-k``): it counts from the end, which the rules do not read. A
    sum that merely sorts a negative term first (``n - n % b``) is not one."""
    return isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub) or \
        isinstance(e, ast.Constant) and isinstance(e.value, (int, float)) and e.value < 0


def _spec(e, env: dict | None = None) -> tuple | None:
    if isinstance(e, ast.Slice):
        lo, hi = _norm(e.lower, env), _norm(e.upper, env)
        if _negative(e.lower) or _negative(e.upper) or lo.lstrip("-").isdigit() and lo.startswith("-") \
                or hi.lstrip("-").isdigit() and hi.startswith("-"):
            return None
        if e.step is not None:
            st = _norm(e.step)
            if not st.isdigit() or hi:
                return None
            return ("step", lo or "0", st)
        return ("range", lo or "0", hi)
    if isinstance(e, (ast.Constant, ast.Name, ast.Attribute, ast.BinOp)):
        i = _norm(e, env)
        if _negative(e) or i.lstrip("-").isdigit() and i.startswith("-") \
                or isinstance(e, ast.Constant) and not isinstance(e.value, int):
            return None
        return ("range", i, _norm(e, env, plus=1))
    return None


def _eval_int(e, bindings: dict) -> int | None:
    """The value of a size expression made of integers, bound names, ``+ - * //``; else None."""
    if isinstance(e, ast.Constant) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return e.value
    if isinstance(e, ast.Name):
        return bindings.get(e.id)
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
        a, b = _eval_int(e.left, bindings), _eval_int(e.right, bindings)
        if a is None or b is None or (isinstance(e.op, ast.FloorDiv) and b == 0):
            return None
        return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}.get(type(e.op), a // b if b else 0)
    return None


def _size_on(shape: list | None, dim: int, bindings: dict | None = None, env: dict | None = None) -> str | None:
    if shape is None or not -len(shape) <= dim < len(shape):
        return None
    v = _eval_int(shape[dim], bindings) if bindings else None
    return str(v) if v is not None else _norm(shape[dim], env)


def _branch_groups(slices: list, parents: dict, stop) -> list[tuple[dict, list]]:
    """The writes ``slices`` grouped by the ``if`` branches they sit in (below ``stop``, the
    allocation): for each innermost branch, the writes that run on it (its own and those of the
    branches around it), with the names its tests pin (``if q == 4:``)."""
    paths = []
    for sl in slices:
        path, child, n = [], sl, parents.get(sl)
        while n is not None and n is not stop and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(n, ast.If) and child is not n.test:
                path.append((n, any(child is c for c in n.body)))
            child, n = n, parents.get(n)
        paths.append(tuple(reversed(path)))
    leaves = [p for p in dict.fromkeys(paths) if not any(q != p and q[:len(p)] == p for q in paths)]
    groups = []
    for leaf in leaves or [()]:
        bindings = {}
        for node, in_body in leaf:
            t = node.test
            if in_body and isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq) \
                    and isinstance(t.left, ast.Name) and isinstance(t.comparators[0], ast.Constant) \
                    and isinstance(t.comparators[0].value, int):
                bindings[t.left.id] = t.comparators[0].value
        groups.append((bindings, [sl for sl, p in zip(slices, paths) if leaf[:len(p)] == p]))
    return groups


def _independent_writes(slices: list, parents: dict, stop, group: list) -> list:
    """The writes of ``slices`` outside ``group`` that may run with it: under another ``if`` than the
    one whose other branch holds them (``if a: x[:n] = ...`` then ``if b: x[n] = ...``)."""
    def path(sl):
        out, child, n = [], sl, parents.get(sl)
        while n is not None and n is not stop and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(n, ast.If) and child is not n.test:
                out.append((n, any(child is c for c in n.body)))
            child, n = n, parents.get(n)
        return list(reversed(out))

    mine = [path(g) for g in group]
    def exclusive(a, b):
        for (na, fa), (nb, fb) in zip(a, b):
            if na is not nb:
                return False
            if fa != fb:
                return True
        return False
    return [sl for sl in slices if all(sl is not g for g in group)
            and not any(exclusive(path(sl), m) for m in mine)]


def _ranges(xs: list, limit: int = 6) -> str:
    """Sorted ints as half-open runs, ``[3, 7) and [9, 10)``; past ``limit`` runs, a count of the rest."""
    runs = []
    for x in xs:
        if runs and runs[-1][1] == x:
            runs[-1][1] = x + 1
        else:
            runs.append([x, x + 1])
    text = " and ".join(f"[{a}, {b})" for a, b in runs[:limit])
    return text + (f" and {len(runs) - limit} more runs" if len(runs) > limit else "")


def _gap(slices: list, shape: list | None, bindings: dict | None = None,
         env: dict | None = None) -> tuple[str | None, bool]:
    """What the writes ``slices`` (their slice nodes) leave unwritten: ``(None, False)`` when they
    cover every element, else ``(description, strength)``: ``"provable"`` when that part is certainly
    never written (an index of a literal-sized dimension, a start a stride misses); ``"prefix"`` when
    the writes cover ``[0, n)`` of one dimension whose allocated size is another expression (the
    padded buffer written on its real rows: ``[n, size)`` is left, if ``size > n``); ``False`` when the
    tool cannot tell which part stays unwritten (index tensors, unknown sizes, several dimensions).
    ``bindings``
    gives names of the shape a value (the branch the writes run on pins them); ``env`` the values of
    names assigned once (:func:`_env`), so that ``total = n + m`` is the bound ``n + m``."""
    regions = [_region(s, env) for s in slices]
    if any(r == ("whole", None) for r in regions):
        return None, False
    if not regions or any(r is None for r in regions) or len({r[0] for r in regions}) != 1:
        return "the writes restrict different dimensions (or several at once): their union is not read", False
    dim = regions[0][0]
    specs = [r[1] for r in regions]
    size = _size_on(shape, dim, bindings, env)
    where = f"dimension {dim}" + (f" (size {size})" if size else "")
    if all(s[0] == "step" for s in specs):
        steps = {s[2] for s in specs}
        if len(steps) == 1:
            step = int(next(iter(steps)))
            missing = sorted(set(range(step)) - {int(s[1]) for s in specs if s[1].isdigit()})
            if not missing:
                return None, False
            return f"{where}: the strided writes miss start(s) {missing} of step {step}", "provable"
        return f"{where}: strided writes with different steps", False
    if any(s[0] == "step" for s in specs):
        return f"{where}: strided and plain writes mixed", False
    reached, changed = {"0"}, True
    while changed:
        changed = False
        for _, lo, hi in specs:
            if lo in reached and hi not in reached:
                reached.add(hi)
                changed = True
    if "" in reached or (size is not None and size in reached):
        return None, False
    ends = sorted(reached - {"0"}, key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0, s))
    last = ends[-1] if ends else "0"
    if size is not None and size.isdigit() and all(x.isdigit() for x in reached):
        hit = set()
        for _, lo, hi in specs:
            if lo.isdigit() and hi.isdigit():
                hit |= set(range(int(lo), int(hi)))
        missing = sorted(set(range(int(size))) - hit)
        return f"{where}: index(es) {_ranges(missing)} never written", "provable"
    strength = "prefix" if size is not None and last != "0" else False
    return f"{where}: [{last}, {size or 'the allocated length'}) is not shown written", strength


# ---- where an allocation's size came from --------------------------------------------------------

def _rounded_up(e) -> bool:
    """``(n + k - 1) // k * k``, ``-(-n // k) * k``, ``cdiv(n, k) * k``, ``(n + k) & ~k``: n rounded up; and
    a count of blocks rounded up, ``(n + k - 1) // k`` or ``-(-n // k)`` (each block's k rows elsewhere)."""
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.FloorDiv) and isinstance(e.left, ast.BinOp) \
            and isinstance(e.left.op, ast.Add) or isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub) \
            and isinstance(e.operand, ast.BinOp) and isinstance(e.operand.op, ast.FloorDiv):
        return True
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
        return any(isinstance(s, ast.BinOp) and isinstance(s.op, ast.FloorDiv) or
                   isinstance(s, ast.UnaryOp) and isinstance(s.operand, ast.BinOp) and isinstance(s.operand.op, ast.FloorDiv)
                   for side in (e.left, e.right) for s in ast.walk(side))
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.BitAnd):
        return any(isinstance(s, ast.UnaryOp) and isinstance(s.op, ast.Invert) for s in ast.walk(e))
    return False


def _pad_reason(expr) -> str | None:
    for n in ast.walk(expr):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name and _PAD_NAME.search(name):
            return _src(expr)
        if _rounded_up(n):
            return _src(expr)
    return None


_ASSIGNS: dict[int, tuple[list, dict]] = {}   # id(stmts) -> (stmts, {name: [(line, value), ...]})


def _assignments(stmts: list) -> dict:
    """The assignments of a function's statements by target name, built once per function (so that
    looking back from every allocation site stays linear in the size of the function)."""
    hit = _ASSIGNS.get(id(stmts))
    if hit is not None and hit[0] is stmts:
        return hit[1]
    by_name: dict[str, list] = {}
    for st in stmts:
        if not isinstance(st, (ast.Assign, ast.AnnAssign)) or st.value is None:
            continue
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        for t in targets:
            if isinstance(t, ast.Name):
                by_name.setdefault(t.id, []).append((st.lineno, st.value))
            elif isinstance(t, ast.Tuple) and isinstance(st.value, ast.Tuple) and len(t.elts) == len(st.value.elts):
                for k, v in zip(t.elts, st.value.elts):
                    if _dotted(k):
                        by_name.setdefault(_dotted(k), []).append((st.lineno, v))
    if len(_ASSIGNS) > 4096:
        _ASSIGNS.clear()
    _ASSIGNS[id(stmts)] = (stmts, by_name)
    return by_name


def _padding(call: ast.Call, stmts: list, before: int, depth: int = 3) -> str | None:
    """Does the allocation's size look padded (round_up, cdiv, align, pad, ``(n + 127) // 128 * 128``)?
    Its size expressions are read, and the assignments of the names in them, up to ``depth`` steps
    back among ``stmts`` (the function's statements) before line ``before``: the answer is the padded
    expression and where it is, or None."""
    exprs = list(call.args) + [k.value for k in call.keywords if k.arg in (None, "size")]
    seen: set[str] = set()
    by_name = _assignments(stmts)
    for level in range(depth + 1):
        for e in exprs:
            why = _pad_reason(e)
            if why is not None:
                return why if level == 0 else f"{why} (line {e.lineno})"
        names = {n.id for e in exprs for n in ast.walk(e) if isinstance(n, ast.Name)} - seen
        seen |= names
        found = sorted(((line, value) for name in names for line, value in by_name.get(name, ()) if line < before),
                       key=lambda lv: (lv[0], lv[1].col_offset))      # in source order, as the function reads
        exprs = [value for _, value in found]
        if not exprs:
            return None
    return None
    return None
