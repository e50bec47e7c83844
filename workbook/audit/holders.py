"""The objects that hold a buffer reached through an attribute chain: ``model`` and ``model.gru`` hold
``model.gru.weight``. A call on one of them (``model.run(x)``, ``model.gru(x)``) or one passed to a call
(``evaluate(model)``) between the fill and the overwrite may read the buffer through ``self``: the audit
does not follow it, so it is a use whose effect is unknown, as a call the audit cannot see is (the trail
is lost there: low, naming the call) where the buffer is then overwritten; where it is read or kept
first, that use decides, as before. An object that does not hold the buffer (another name, or the
chain's next attribute itself, ``model.gru.weight``) and a builtin that only looks at the object
(``isinstance(model, M)``, ``getattr(model, "x")``) are no such use."""
from __future__ import annotations

import ast

from .source import _src

_NO_READ = {"isinstance", "issubclass", "getattr", "hasattr", "setattr", "delattr", "type", "id", "callable", "len",
            "vars", "dir"}   # builtins that look at an object, never at its tensors' elements


def _holder_nodes(names: dict, parents: dict, key: str) -> list:
    """The occurrences (in ``names``, a function's dotted name -> nodes) of each proper prefix of the
    dotted ``key`` that are called (``model.gru(x)``), passed to a call (``f(model)``) or whose method
    other than the chain's next attribute is called (``model.run(x)``)."""
    parts = key.split(".")
    out = []
    for i in range(1, len(parts)):
        for n in names.get(".".join(parts[:i]), ()):
            if _called_on(n, parents, parts[i]):
                out.append(n)
    return out


def _called_on(n, parents: dict, nxt: str) -> bool:
    par = parents.get(n)
    if isinstance(par, ast.Attribute) and par.value is n:
        gp = parents.get(par)
        return par.attr != nxt and isinstance(gp, ast.Call) and gp.func is par
    if isinstance(par, ast.Starred):
        par = parents.get(par)
    elif isinstance(par, ast.keyword):
        par = parents.get(par)
    return isinstance(par, ast.Call) and not (isinstance(par.func, ast.Name) and par.func.id in _NO_READ)


def _holder_use(n, key: str, parents: dict) -> tuple[int, str]:
    """Where and how a call on (or with) ``n``, an object holding the buffer ``key``, uses it: an
    escape (the trail is lost there, low), naming the call."""
    call = parents.get(n)
    while call is not None and not isinstance(call, ast.Call):
        call = parents.get(call)
    what = _src(call)[:80] if call is not None else _src(n)
    return n.lineno, f"{what} may read {key} through {_src(n)}, which holds it: the call is not followed"
