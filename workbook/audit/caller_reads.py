"""A partly written ``empty`` buffer returned to callers that read only parts of it
(:func:`callers_read_parts`, a part of :func:`workbook.audit.sites._judge_empty`), and one whose whole
return runs only under a flag that no call in the files sets (:func:`flag_never_set`, see its comment).

``empty = torch.empty(T_new)``, ``empty[:T] = prompt``, ``return empty, input_pos``: the tail
``[T, T_new)`` is never written and the buffer is returned whole, so the gap looked proven. But where
every caller of the function in the files takes the returned value (the same element of a returned
tuple) into a name and uses that name only through a slice, an index, ``narrow`` or ``index_select``
(``seq.index_select(0, input_pos)``, ``buf[:n]``; or reads only its metadata: ``.shape``, ``.size()``),
no caller in the files is shown to read the unwritten part: whether those bounds stay inside the
written part is not compared (an index tensor's values are not known), and callers outside the files
given are not seen, so the finding is low and names the callers and their reads.

Kept as before (the gap stands): no caller in the files (the function's name defined more than once,
or called only at module level, where the callers are not told apart), a caller that uses the value
whole (returned again, passed whole to a function, used in arithmetic, stored, unpacked another way,
assigned to an attribute), or a caller the scan cannot place (a call that is not ``name = f(..)`` or
``a, b = f(..)``).
"""
from __future__ import annotations

import ast

from .source import _call_lines, _call_name, _src

_PART_METHODS = {"narrow", "index_select"}
_META = {"shape", "dtype", "device", "size", "numel", "dim", "ndim", "stride", "is_cuda", "is_contiguous",
         "element_size", "nelement"}


def _return_index(fn, var: str, line: int | None) -> tuple[bool, int | None]:
    """``(found, index)``: the ``return`` at ``line`` hands on ``var`` (or a name assigned from it,
    ``seq = empty``) whole (index None) or as element ``index`` of a returned tuple."""
    names = {var}
    for node in ast.walk(fn.node):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Name) and node.value.id in names:
            names.add(node.targets[0].id)
    for node in ast.walk(fn.node):
        if not isinstance(node, ast.Return) or node.lineno != line or node.value is None:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in names:
            return True, None
        if isinstance(node.value, ast.Tuple):
            hit = [i for i, e in enumerate(node.value.elts) if isinstance(e, ast.Name) and e.id in names]
            if len(hit) == 1:
                return True, hit[0]
    return False, None


def _def_of(node, parents):
    n = parents.get(node)
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        n = parents.get(n)
    return n


def _calls(project, name: str) -> tuple[list, bool]:
    """``([(caller function, call)], all placed)``: the calls of ``name`` in the files; ``all placed``
    is False where a call is found outside any def (module level), which is not followed."""
    out, placed, seen = [], True, set()
    for src in project.sources.values():
        if src.broken:
            continue
        lines = src.text.splitlines()
        for line0 in _call_lines(src, {name}):
            text = lines[line0].lstrip() if line0 < len(lines) else ""
            if text.startswith(("def ", "async def ")):
                continue
            d = src.enclosing_def(line0)
            if d is None:
                placed = False
                continue
            for cfn in project.load(src.name, d[0], d[1]):
                if id(cfn.node) in seen:
                    continue
                seen.add(id(cfn.node))
                out += [(cfn, n) for n in ast.walk(cfn.node) if isinstance(n, ast.Call) and _call_name(n) == name
                        and _def_of(n, cfn.parents) is cfn.node]
    return out, placed


def _received(cfn, call, index: int | None) -> str | None:
    """The name the caller puts the returned buffer in (``seq = f(..)``, ``seq, pos = f(..)``), or None."""
    par = cfn.parents.get(call)
    if not isinstance(par, ast.Assign) or par.value is not call or len(par.targets) != 1:
        return None
    t = par.targets[0]
    if index is None:
        return t.id if isinstance(t, ast.Name) else None
    if isinstance(t, ast.Tuple) and index < len(t.elts) and not any(isinstance(e, ast.Starred) for e in t.elts):
        e = t.elts[index]
        return e.id if isinstance(e, ast.Name) else None
    return None


def _part_read(n, parents) -> str | None:
    """The text of a read of part of the buffer through the name ``n`` (a slice, an index, ``narrow``,
    ``index_select``, metadata), or None (a whole use)."""
    par = parents.get(n)
    if isinstance(par, ast.Subscript) and par.value is n:
        return _src(par)
    if isinstance(par, ast.Attribute) and par.value is n:
        call = parents.get(par)
        if par.attr in _PART_METHODS and isinstance(call, ast.Call) and call.func is par:
            return _src(call)
        if par.attr in _META:
            return _src(call if isinstance(call, ast.Call) and call.func is par else par)
    if isinstance(par, ast.Call) and par.args and par.args[0] is n and isinstance(par.func, ast.Attribute) \
            and par.func.attr in _PART_METHODS and isinstance(par.func.value, ast.Name) and par.func.value.id == "torch":
        return _src(par)
    return None


def _caller_reads(cfn, call, index: int | None) -> list[str] | None:
    """The caller's reads of the returned buffer, each a part read; None where one uses it whole."""
    name = _received(cfn, call, index)
    if name is None:
        return None
    reads = []
    for n in ast.walk(cfn.node):
        if not isinstance(n, ast.Name) or n.id != name or not isinstance(n.ctx, ast.Load):
            continue
        r = _part_read(n, cfn.parents)
        if r is None:
            return None
        reads.append(r)
    return reads


def callers_read_parts(project, fn, var: str, use) -> str | None:
    """Why the gap is not proven when the buffer is returned whole and every caller in the files reads
    it only through slices or indexes (see the module); None otherwise (the gap stands)."""
    if not (use.consumer or "").startswith("returned whole to the callers of"):
        return None
    name = getattr(fn.node, "name", None)
    if name is None or len(project.index.get(name, [])) != 1:
        return None
    found, index = _return_index(fn, var, use.consumer_line)
    if not found:
        return None
    calls, placed = _calls(project, name)
    if not calls or not placed:
        return None
    said = []
    for cfn, call in calls:
        reads = _caller_reads(cfn, call, index)
        if reads is None:
            return None
        what = ", ".join(sorted(set(reads))[:3]) if reads else "does not use it"
        said.append(f"{cfn.qualname} ({cfn.file}:{call.lineno}): {what}")
    part = "" if index is None else f" (element {index} of the returned tuple)"
    return (f"every caller of {name}() in the files reads the returned buffer{part} only through slices, indexes, "
            f"narrow or index_select ({'; '.join(said[:4])}{'; ...' if len(said) > 4 else ''}), whose bounds the "
            "audit does not compare with the written part: no caller is shown to read the unwritten part; callers "
            "outside the files given are not seen")


# ---- a whole return that only a flag no call sets reaches (:func:`flag_never_set`) ----------------
# ``def pack(x, return_raw=False): buf = empty(n + 64); buf[:n] = x; if return_raw: return buf``, then
# ``return buf[:n].view(..)``: the whole buffer leaves only under the flag. Where the flag is a parameter
# with a false default (False, None, 0) and every call of the function in the files leaves it there (not
# given, given a false constant, or given the caller's own such parameter, which no call of the caller
# sets: followed up to _FLAG_DEPTH calls), the return that hands on the gap is not shown to run: low.
# Kept as before: a call that sets the flag (or gives it any other value), a call outside any def, no
# call in the files, a name defined twice, or a later whole use of the buffer outside the flag's ``if``.

_FLAG_DEPTH = 3


def _false_default(fn, param: str) -> bool:
    """Is ``param`` a parameter of ``fn`` whose default is False, None or 0?"""
    a = fn.node.args
    pos = a.posonlyargs + a.args
    pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + \
        [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
    return any(p.arg == param and isinstance(d, ast.Constant) and not d.value for p, d in pairs)


def _flag_guard(fn, ret) -> str | None:
    """The parameter ``p`` of ``if p:`` whose body holds the ``return`` node ``ret`` (directly inside)."""
    child, p = ret, fn.parents.get(ret)
    while p is not None and p is not fn.node:
        if isinstance(p, ast.If) and any(child is s for s in p.body):
            t = p.test
            if isinstance(t, ast.Name) and _false_default(fn, t.id):
                return t.id
            return None
        child, p = p, fn.parents.get(p)
    return None


def _flag_unset_by_calls(project, fn, flag: str, depth: int, said: list) -> bool:
    """Does every call of ``fn`` in the files leave its parameter ``flag`` at its false default?"""
    name = getattr(fn.node, "name", None)
    if name is None or depth > _FLAG_DEPTH or len(project.index.get(name, [])) != 1:
        return False
    calls, placed = _calls(project, name)
    if not calls or not placed:
        return False
    params = [p.arg for p in fn.node.args.posonlyargs + fn.node.args.args]
    skip = 1 if params and params[0] in ("self", "cls") else 0
    for cfn, call in calls:
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return False
        given = next((k.value for k in call.keywords if k.arg == flag), None)
        i = params.index(flag) - skip if flag in params else None
        if given is None and i is not None and 0 <= i < len(call.args):
            given = call.args[i]
        where = f"{cfn.qualname} ({cfn.file}:{call.lineno})"
        if given is None or isinstance(given, ast.Constant) and not given.value:
            said.append(f"{where}: {'not given' if given is None else _src(given)}")
        elif isinstance(given, ast.Name) and _false_default(cfn, given.id) \
                and _flag_unset_by_calls(project, cfn, given.id, depth + 1, said):
            said.append(f"{where}: its own {given.id}")
        else:
            return False
    return True


def flag_never_set(project, fn, var: str, use) -> str | None:
    """Why the gap is not proven when the whole return runs only under a flag that every call in the
    files leaves false (see above); None otherwise (the gap stands)."""
    if not (use.consumer or "").startswith("returned whole to the callers of"):
        return None
    found, _ = _return_index(fn, var, use.consumer_line)
    ret = next((n for n in ast.walk(fn.node) if isinstance(n, ast.Return) and n.lineno == use.consumer_line), None)
    flag = _flag_guard(fn, ret) if found and ret is not None else None
    if flag is None:
        return None
    guard = fn.parents.get(ret)
    while not isinstance(guard, ast.If):
        guard = fn.parents.get(guard)
    inside = {id(n) for n in ast.walk(guard)}
    for n in ast.walk(fn.node):       # after the flag's if, the buffer is used only in part
        if isinstance(n, ast.Name) and n.id == var and isinstance(n.ctx, ast.Load) and id(n) not in inside \
                and n.lineno > guard.lineno and _part_read(n, fn.parents) is None:
            return None
    said: list = []
    if not _flag_unset_by_calls(project, fn, flag, 0, said):
        return None
    return (f"the whole return (line {ret.lineno}) runs only when {flag} is true, which defaults to false and "
            f"no call in the files sets ({'; '.join(said[:4])}{'; ...' if len(said) > 4 else ''}); elsewhere "
            "the buffer is handed on only in part: the return is not shown to run; callers outside the files "
            "given are not seen")
