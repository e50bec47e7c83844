"""A read-modify-write launch after the partial writes whose stores reach every element
(:func:`rmw_cover`, a part of :func:`workbook.audit.sites._judge_empty`).

``idx = empty(h, n, topk)``, ``idx[..., :k].copy_(raw)``, then ``mask_kernel[grid](idx, ...)``, then
``return idx``: the kernel loads every slot and stores every slot (``tl.where(valid, idx, -1)``). The
audit reads it as accumulating into the buffer (it loads and stores it), so the gap ``[k, topk)`` looked
proven. But where the kernel's stores pass the test a kernel that only stores passes
(:meth:`workbook.audit.kernel_use._Kernels.stores_whole`: no address or mask that loaded values decide,
no selecting mask, no missed part, no early return, no atomics; and the grid not sized by an autotuned
config the store does not follow), they write every element before any later consumer: the gap the
return hands on is not proven. What the audit cannot show is whether the kernel itself reads the
unwritten values into what it stores (that is its arithmetic: a ``tl.where`` may discard them, an add
keeps them), so the finding is low and says so, naming the kernel and the line. The same holds where
the buffer is passed to a function of the files whose first use of it is such a launch (one level: its
parameters' arguments stand for their names in the bound test below).

Where the stores are not shown to reach every element (rows at loaded offsets, an early return), the
gap is still not proven when the kernel loads the buffer only at addresses it stores, every store of it
is a ``tl.where`` one side of which carries the loaded value and the other does not (``tl.where(valid,
idx, -1)``: a conditional overwrite, as a host write under an ``if`` is), and the stores are not bounded
by the partial writes' bound: low, naming the select (:func:`_selects`; from the 10th check's vllm-ascend
msa_m3_triton_a5.py:740). An add at loaded rows (``v + 1``), a select both of whose sides keep the loaded
value, or a load at an address no store writes keeps the gap.

Kept as before (the gap stands): a kernel with atomics (``tl.atomic_add``: it adds into the buffer), one
whose stores the test does not pass, and one whose stores are bounded by the partial writes' own bound
(``out[:n] = x`` then a kernel that loads, adds and stores ``offs < n``, or a grid of ``cdiv(n, B)``):
its stores reach only the written part.
"""
from __future__ import annotations

import ast

from .arguments import _position
from .callees import _is_jit
from .kernel_use import _depends, _tainted
from .padded_launch import _launch_at
from .regions import _norm
from .source import _call_name, _params, _src


def _names(e) -> set[str]:
    return {n.id for n in ast.walk(e) if isinstance(n, ast.Name)}


def _uppers(regions: list, shape, env: dict) -> tuple[set, set]:
    """The partial writes' upper bounds: their names (less those of the allocation's shape) and texts."""
    names, texts = set(), set()
    shape_names = set().union(*(_names(d) for d in shape or ()))
    for sl in regions:
        for e in (sl.elts if isinstance(sl, ast.Tuple) else [sl]):
            hi = e.upper if isinstance(e, ast.Slice) else None
            if hi is not None:
                names |= _names(hi) - shape_names
                texts.add(_norm(hi, env))
    return names, texts


def _store_params(project, kern, param: str) -> set | None:
    """The parameters of ``kern`` that the address, mask or enclosing loops and tests of a direct store
    through ``param`` are computed from; None when it stores through a helper (not read here)."""
    body = project._body(kern)
    defs = project._loaded[id(kern.node)][2]
    taint = _tainted(body, param)
    params, found = set(_params(kern.node)), False
    out: set = set()
    for n in body:
        if isinstance(n, ast.Call) and _call_name(n) == "store" and n.args and _names(n.args[0]) & taint:
            found = True
            exprs = list(n.args[:3]) + [k.value for k in n.keywords if k.arg == "mask"]
            p = kern.parents.get(n)
            while p is not None and p is not kern.node:
                if isinstance(p, (ast.For, ast.While, ast.If)):
                    exprs.append(getattr(p, "iter", None) or p.test)
                p = kern.parents.get(p)
            for e in exprs:
                out |= _depends(e, defs)[0] & params
    return out if found else None


def _bounded_by(call, kern, params: set | None, bound_names: set, bound_texts: set, env: dict,
               alias: dict) -> str | None:
    """The grid dimension or argument (given to a parameter the stores follow) that names the partial
    writes' bound: the stores reach only the written part. ``alias``: in a called function, its
    parameters' arguments at the call (their names count as the names of the parameter)."""
    grid = call.func.slice
    exprs = list(grid.elts) if isinstance(grid, ast.Tuple) else [grid]
    kparams = _params(kern.node)
    for i, a in enumerate(call.args):
        if isinstance(a, ast.Starred):            # the positions past it are not known: read them all
            exprs += call.args[i:]
            break
        if params is None or i < len(kparams) and kparams[i] in params:
            exprs.append(a)
    exprs += [k.value for k in call.keywords if params is None or k.arg in params]
    for e in exprs:
        names = set().union(*({n} | (_names(alias[n]) if n in alias else set()) for n in _names(e)))
        texts = {_norm(e, env)} | {_norm(alias[n], env) for n in _names(e) if n in alias}
        if names & bound_names or texts & bound_texts:
            return _src(e)
    return None


def _rmw_param(project, host, call, var: str) -> tuple:
    """``(kernel, param)`` when the launch ``call`` in ``host`` gives ``var`` (by name, positionally or as a
    keyword) to the one Triton kernel of the files it names, and that kernel both loads and stores it;
    else ``(None, None)``."""
    arg = next((a for a in call.args if isinstance(a, ast.Name) and a.id == var), None)
    kw = next((k.arg for k in call.keywords if isinstance(k.value, ast.Name) and k.value.id == var), None)
    if arg is None and kw is None:
        return None, None
    idx = _position(call, arg, host)[0] if arg is not None else None
    kernels = [k for k in project.resolve_all(_call_name(call), host.file)[0] if _is_jit(k.node)]
    if len(kernels) != 1:
        return None, None
    params = _params(kernels[0].node)
    param = kw or (params[idx] if idx is not None and idx < len(params) else None)
    if param is None or project.kernel_use(kernels[0], param) != "rmw":
        return None, None
    return kernels[0], param


def _writes_all(project, host, call, var: str, bound: tuple, env: dict, alias: dict) -> tuple | None:
    """``(kernel, param)`` when the launch ``call`` in ``host`` gives ``var`` to a kernel that loads and
    stores it and whose stores reach every element, not bounded by the partial writes' ``bound``."""
    from .analyzer import _Use
    kern, param = _rmw_param(project, host, call, var)
    if kern is None or not project.stores_whole(kern, param):
        return None
    probe = project.autotuned_grid(host, call, kern, param, _Use("write", call.lineno, "x)", "high"))
    if probe.confidence != "high":
        return None                       # one element per program on an axis the autotuned config sizes
    if _bounded_by(call, kern, _store_params(project, kern, param), *bound, env, alias) is not None:
        return None                       # its stores reach only the written part: an add into it
    return kern, param


def _store_value(n: ast.Call):
    """The value a ``tl.store`` call stores, less casts (``v.to(dtype)``, ``tl.cast(v, ..)``)."""
    v = n.args[1] if len(n.args) > 1 else next((k.value for k in n.keywords if k.arg == "value"), None)
    while isinstance(v, ast.Call) and _call_name(v) in ("to", "cast"):
        v = v.func.value if _call_name(v) == "to" and isinstance(v.func, ast.Attribute) else (v.args or [None])[0]
    return v


def _selects(project, kern, param: str) -> str | None:
    """The ``tl.where`` every direct store through ``param`` stores, when one side of it carries the
    value loaded from ``param`` and the other does not, and every load through ``param`` reads an address
    a store writes (a conditional overwrite of what it loads); None otherwise (an add, atomics, a helper
    given the pointer, a load elsewhere)."""
    body = project._body(kern)
    defs = project._loaded[id(kern.node)][2]
    taint = _tainted(body, param)
    stores, loads, carried = [], [], set()
    for n in body:
        if not isinstance(n, ast.Call):
            continue
        name = _call_name(n)
        through = bool(n.args) and bool(_names(n.args[0]) & taint)
        if name.startswith("atomic_") and through:
            return None                    # it adds into the buffer
        if name not in ("store", "load") and any(_names(a) & taint for a in n.args) \
                and any(_is_jit(c.node) for c in project.resolve_all(name, kern.file)[0]):
            return None                    # the pointer (or a value from it) handed to a helper: not read here
        if name == "store" and through:
            stores.append(n)
        elif name == "load" and through:
            loads.append(n)
            st = kern.parents.get(n)
            if isinstance(st, ast.Assign) and st.value is n and all(isinstance(t, ast.Name) for t in st.targets):
                for t in st.targets:
                    carried |= _tainted(body, t.id)
            else:
                return None                # a load used in place (v + tl.load(p)): its value is kept
    addresses = {ast.unparse(s.args[0]) for s in stores}
    if not stores or not loads or any(ast.unparse(ld.args[0]) not in addresses for ld in loads):
        return None
    said = set()
    for s in stores:
        v = _store_value(s)
        if isinstance(v, ast.Name) and len(defs.get(v.id, [])) == 1:
            v = defs[v.id][0]
        if not (isinstance(v, ast.Call) and _call_name(v) == "where" and len(v.args) == 3):
            return None
        sides = [bool(_names(a) & carried) for a in v.args[1:]]
        if sides.count(True) != 1:
            return None                    # both sides keep the loaded value, or neither shows it
        said.add(_src(v))
    return sorted(said)[0]


def _overwrites_some(project, host, call, var: str, bound: tuple, env: dict, alias: dict) -> tuple | None:
    """``(kernel, param, the tl.where)`` when the launch ``call`` gives ``var`` to a kernel whose every
    store of it is a select between the value it loaded there and another (:func:`_selects`), and whose
    stores are not bounded by the partial writes' ``bound``."""
    kern, param = _rmw_param(project, host, call, var)
    if kern is None:
        return None
    where = _selects(project, kern, param)
    if where is None or _bounded_by(call, kern, _store_params(project, kern, param), *bound, env, alias) is not None:
        return None
    return kern, param, where


def _called(project, fn, var: str, line: int):
    """``(callee, its parameter, {parameter: argument})`` for the call of a function of the files at
    ``line`` that is given ``var`` (by name), or None."""
    call = next((n for n in ast.walk(fn.node) if isinstance(n, ast.Call) and not isinstance(n.func, ast.Subscript)
                 and n.lineno <= line <= (n.end_lineno or n.lineno)
                 and any(isinstance(a, ast.Name) and a.id == var for a in n.args)), None)
    callees = [c for c in project.resolve_all(_call_name(call), fn.file)[0]
               if not _is_jit(c.node) and c.node is not fn.node] if call is not None else []
    if len(callees) != 1 or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    params = _params(callees[0].node)
    skip = 1 if params and params[0] in ("self", "cls") and (callees[0].is_method or isinstance(call.func, ast.Attribute)) else 0
    alias = dict(zip(params[skip:], call.args)) | {k.arg: k.value for k in call.keywords if k.arg in params}
    param = next((p for p, a in alias.items() if isinstance(a, ast.Name) and a.id == var), None)
    return (callees[0], param, alias) if param is not None else None


def rmw_cover(project, fn, var: str, use, regions: list, shape, env: dict) -> str | None:
    """Why the gap is not proven when the consumer is a Triton launch (or a call of a function of the
    files whose first use of the buffer is one) that loads and stores the buffer and whose stores reach
    every element (see the module); None otherwise (the gap stands)."""
    if use.consumer_line is None or "is loaded and stored" not in (use.consumer or ""):
        return None
    bound = _uppers(regions, shape, env)
    host, var_in, alias, call = fn, var, {}, _launch_at(fn, var, use.consumer_line)
    if call is None:
        called = _called(project, fn, var, use.consumer_line)
        if called is None:
            return None
        host, var_in, alias = called
        u = project.param_use(host, var_in, 0)
        call = _launch_at(host, var_in, u.line) if u.kind == "accumulate" else None
        if call is None:
            return None
    found = _writes_all(project, host, call, var_in, bound, env, alias)
    where = f"line {call.lineno}" if host is fn else f"{host.file}:{call.lineno}, in {host.qualname}()"
    if found is None:
        sel = _overwrites_some(project, host, call, var_in, bound, env, alias)
        if sel is None:
            return None
        kern, param, what = sel
        return (f"Triton launch {_call_name(call)} ({where}) loads param '{param}' ({kern.file}:{kern.node.lineno}) "
                f"only where it stores it, and stores {what if len(what) <= 60 else what[:57] + '...'} there: a "
                "conditional overwrite of what it loads, at places not bounded by the partial writes (which ones "
                "loaded values or an early return decide): the gap is neither shown unwritten nor shown read")
    kern, param = found
    return (f"Triton launch {_call_name(call)} ({where}) loads and stores param '{param}' "
            f"({kern.file}:{kern.node.lineno}) and its stores reach every element (no mask or address that "
            "loaded values decide, no early return, no bound of the partial writes): it writes the gap before "
            "any later use; whether it reads the unwritten values into what it stores depends on its arithmetic "
            "(a tl.where may discard them), which the audit does not read")
