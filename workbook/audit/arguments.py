"""Which position of a call an argument takes, once its starred arguments are expanded.

``kernel[grid](a, b, *strides, out)``: ``out`` is the parameter at index 2 + len(strides). The
length of a starred expression is taken only where the function shows it (:func:`_star_len`): a tuple
or list literal (written in the call or assigned to the name, every assignment agreeing), or the
sizes/strides of a tensor whose number of dimensions the function shows (:func:`_ndim`: allocated or
viewed with its sizes written out, unpacked as ``a, b, c = x.shape``, or asserted ``x.ndim == 3``).
Otherwise the position is unknown and :func:`_position` says why: the caller reports where the trail
is lost instead of reading the argument as some other parameter."""
from __future__ import annotations

import ast

from .regions import _alloc_shape
from .source import _call_name, _dotted, _src

_SAME_NDIM = {"contiguous", "clone", "to", "float", "half", "bfloat16", "detach", "cuda", "cpu", "type_as",
              "zeros_like", "empty_like", "ones_like", "full_like", "rand_like", "randn_like"}
_DEPTH = 4


def _position(call: ast.Call, arg, fn) -> tuple[int | None, str | None]:
    """``(index, None)``: the parameter index ``arg`` (one of ``call.args``) takes once the starred
    arguments before it are expanded; ``(None, why)`` when a starred argument before it has a length
    the function does not show; ``(None, None)`` when ``arg`` is not a positional argument."""
    offset = 0
    for a in call.args:
        if a is arg:
            return offset, None
        if isinstance(a, ast.Starred):
            n = _star_len(a.value, fn, _DEPTH)
            if n is None:
                return None, (f"it is passed after *{_src(a.value)} (line {a.lineno}), whose length is not known "
                              "statically: which parameter receives it is not known")
            offset += n
        else:
            offset += 1
    return None, None


def _star_len(e, fn, depth: int) -> int | None:
    """How many elements the starred expression ``e`` expands to, or None when not shown."""
    if depth <= 0:
        return None
    if isinstance(e, (ast.Tuple, ast.List)):
        total = 0
        for x in e.elts:
            n = _star_len(x.value, fn, depth - 1) if isinstance(x, ast.Starred) else 1
            if n is None:
                return None
            total += n
        return total
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add):
        a, b = _star_len(e.left, fn, depth - 1), _star_len(e.right, fn, depth - 1)
        return None if a is None or b is None else a + b
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and not e.args and not e.keywords \
            and e.func.attr in ("stride", "size"):
        return _ndim(e.func.value, fn, depth - 1)
    if isinstance(e, ast.Attribute) and e.attr == "shape":
        return _ndim(e.value, fn, depth - 1)
    if isinstance(e, ast.Name) and e.id not in _param_names(fn.node):
        return _agreed(_assigned_values(e.id, fn), lambda v: _star_len(v, fn, depth - 1))
    return None


def _assigned_values(name: str, fn) -> list | None:
    """The values ``name`` is assigned in the function (plain ``name = value`` statements), or None when
    it is also bound another way (a loop or ``with`` target, an unpacking, ``+=``)."""
    values = []
    for n in fn.names.get(name, ()):
        if not isinstance(getattr(n, "ctx", None), ast.Store):
            continue
        st = fn.parents.get(n)
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and st.targets[0] is n:
            values.append(st.value)
        elif isinstance(st, ast.AnnAssign) and st.target is n and st.value is not None:
            values.append(st.value)
        else:
            return None
    return values


def _param_names(node) -> set[str]:
    a = node.args
    names = {p.arg for p in list(getattr(a, "posonlyargs", [])) + list(a.args) + list(a.kwonlyargs)}
    return names | {p.arg for p in (a.vararg, a.kwarg) if p is not None}


def _agreed(values: list | None, measure) -> int | None:
    if not values:
        return None
    found = {measure(v) for v in values}
    return found.pop() if len(found) == 1 and None not in found else None


def _ndim(x, fn, depth: int) -> int | None:
    """The number of dimensions of tensor ``x`` as the function shows it, or None."""
    key = _dotted(x)
    if key is None or depth <= 0:
        return None
    seen = set()
    for n in fn.names.get(key, ()):          # a, b, c = x.shape; assert x.ndim == 3
        seen.add(_ndim_said(n, fn))
    seen.discard(None)
    if "." not in key:
        made = _assigned_values(key, fn)
        if made is None or made and key in _param_names(fn.node):
            return None                      # bound some other way, or a parameter rebound: not shown
        seen |= {_ndim_made(v, fn, depth - 1) for v in made}
    return seen.pop() if len(seen) == 1 and None not in seen else None


def _ndim_said(n, fn) -> int | None:
    """What one occurrence of the tensor says of its dimensions: ``a, b = x.shape`` (or ``x.size()``),
    ``assert x.ndim == 2`` (or ``x.dim() == 2``)."""
    par = fn.parents.get(n)
    if not isinstance(par, ast.Attribute) or par.value is not n:
        return None
    expr = par
    if par.attr in ("size", "dim"):
        call = fn.parents.get(par)
        if not (isinstance(call, ast.Call) and call.func is par and not call.args):
            return None
        expr = call
    elif par.attr not in ("shape", "ndim"):
        return None
    holder = fn.parents.get(expr)
    if par.attr in ("shape", "size") and isinstance(holder, ast.Assign) and holder.value is expr \
            and len(holder.targets) == 1 and isinstance(holder.targets[0], (ast.Tuple, ast.List)):
        elts = holder.targets[0].elts
        return None if any(isinstance(t, ast.Starred) for t in elts) else len(elts)
    if par.attr in ("ndim", "dim") and isinstance(holder, ast.Compare) and holder.left is expr \
            and len(holder.ops) == 1 and isinstance(holder.ops[0], ast.Eq) \
            and isinstance(fn.parents.get(holder), ast.Assert):
        c = holder.comparators[0]
        return c.value if isinstance(c, ast.Constant) and type(c.value) is int else None
    return None


def _ndim_made(v, fn, depth: int) -> int | None:
    """The number of dimensions of the tensor expression ``v`` (an allocation with its sizes written
    out, a view with its sizes written out, or an op that keeps the dimensions of its input)."""
    if not isinstance(v, ast.Call):
        return None
    shape = _alloc_shape(v)
    if shape is not None:
        return len(shape)
    name = _call_name(v)
    recv = v.func.value if isinstance(v.func, ast.Attribute) else None
    if name in ("view", "reshape") and recv is not None and v.args and not v.keywords:
        if len(v.args) == 1 and isinstance(v.args[0], (ast.Tuple, ast.List)):
            return _star_len(v.args[0], fn, depth)
        if len(v.args) == 1 and not isinstance(v.args[0], ast.Constant):
            return None                      # x.view(shape), x.view(dtype): not shown
        return None if any(isinstance(a, ast.Starred) for a in v.args) else len(v.args)
    if name in _SAME_NDIM:
        src = v.args[0] if name.endswith("_like") and v.args else recv
        return _ndim(src, fn, depth) if src is not None else None
    return None
