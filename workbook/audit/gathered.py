"""A partly written buffer all-gathered into a list of this function whose copies are read only in part
(:func:`gathered_parts`, a part of :func:`workbook.audit.sites._judge_empty`).

``pad = torch.empty(M, k)``, ``pad[:n] = idx``, ``outs = [torch.empty_like(pad) for _ in range(w)]``,
``dist.all_gather(outs, pad)``, ``torch.cat([t[:lens[i]] for i, t in enumerate(outs)])``: the tail
``[n, M)`` is never written and the buffer goes to a collective, so the gap looked proven. But
``all_gather(tensor_list, tensor)`` copies the buffer whole into every element of ``tensor_list``; where
that list is made in this function (a list literal or a comprehension) and every later use of it takes an
element only to read part of it (a slice, an index, ``narrow``, ``index_select``, metadata: in a
comprehension or ``for`` loop over the list, or ``outs[i][:n]``), and the buffer itself is used after the
collective only in part, no reader of the unwritten part is shown: whether those bounds stay inside the
written part (one rank's count against another's) is not compared, so the finding is low and names the
reads.

Kept as before (the gap stands): another collective, an output list that comes from elsewhere (a
parameter, an attribute), or a use of the list or of one of its copies that is whole (``torch.cat(outs)``,
``outs`` returned or passed on, a copy passed whole to a function).
"""
from __future__ import annotations

import ast

from .caller_reads import _part_read
from .source import _call_name, _src


def _collective_call(fn, var: str, line: int):
    """The ``all_gather(list, var)`` call at ``line`` (the list as a local name), or None."""
    for n in ast.walk(fn.node):
        if isinstance(n, ast.Call) and _call_name(n) == "all_gather" and n.lineno <= line <= (n.end_lineno or n.lineno):
            args = {i: a for i, a in enumerate(n.args[:2])}
            args |= {{"tensor_list": 0, "tensor": 1}[k.arg]: k.value for k in n.keywords
                     if k.arg in ("tensor_list", "tensor")}
            out, inp = args.get(0), args.get(1)
            if isinstance(inp, ast.Name) and inp.id == var and isinstance(out, ast.Name):
                return n, out.id
    return None


def _made_here(fn, name: str, call) -> bool:
    """Is ``name`` bound once in ``fn``, before ``call``, to a list literal or a list comprehension?"""
    binds = [n for n in ast.walk(fn.node) if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)]
    if len(binds) != 1:
        return False
    st = fn.parents.get(binds[0])
    return isinstance(st, ast.Assign) and st.targets == [binds[0]] and isinstance(st.value, (ast.List, ast.ListComp)) \
        and st.lineno < call.lineno


def _element_name(it_node, parents) -> tuple | None:
    """For the list used as the iterable of a comprehension generator or a ``for`` loop (directly or as
    ``enumerate(list)``): (the name each element is bound to, the node its uses are in), else None."""
    par = parents.get(it_node)
    enum = isinstance(par, ast.Call) and _call_name(par) == "enumerate" and par.args and par.args[0] is it_node
    holder = parents.get(par) if enum else par
    iter_of = par if enum else it_node
    if not isinstance(holder, (ast.comprehension, ast.For)) or holder.iter is not iter_of:
        return None
    t = holder.target
    if enum:
        t = t.elts[1] if isinstance(t, ast.Tuple) and len(t.elts) == 2 else None
    if not isinstance(t, ast.Name):
        return None
    return t.id, (parents.get(holder) if isinstance(holder, ast.comprehension) else holder)


def _copy_reads(fn, name: str, call) -> list[str] | None:
    """The part reads of the gathered copies in ``name``'s later uses, or None where one is whole."""
    reads = []
    for n in ast.walk(fn.node):
        if not (isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)) or n.lineno < call.lineno \
                or any(n is a for a in ast.walk(call)):
            continue
        par = fn.parents.get(n)
        if isinstance(par, ast.Subscript) and par.value is n and not isinstance(par.slice, ast.Slice):
            r = _part_read(par, fn.parents)        # outs[i][:n]
            if r is None:
                return None
            reads.append(r)
            continue
        elem = _element_name(n, fn.parents)
        if elem is None:
            return None
        el, scope = elem
        uses = [u for u in ast.walk(scope) if isinstance(u, ast.Name) and u.id == el and isinstance(u.ctx, ast.Load)]
        for u in uses:
            r = _part_read(u, fn.parents)
            if r is None:
                return None
            reads.append(r)
    return reads


def gathered_parts(fn, var: str, use) -> str | None:
    """Why the gap is not proven when the buffer is all-gathered into a list of this function whose
    copies are read only in part (see the module); None otherwise (the gap stands)."""
    if use.consumer_line is None or "passed to the collective" not in (use.consumer or ""):
        return None
    found = _collective_call(fn, var, use.consumer_line)
    if found is None:
        return None
    call, out = found
    if not _made_here(fn, out, call):
        return None
    for n in ast.walk(fn.node):            # the buffer itself, after the collective, only in part
        if isinstance(n, ast.Name) and n.id == var and isinstance(n.ctx, ast.Load) and n.lineno > (call.end_lineno or 0) \
                and _part_read(n, fn.parents) is None:
            return None
    reads = _copy_reads(fn, out, call)
    if reads is None:
        return None
    what = ", ".join(sorted(set(reads))[:3]) if reads else "not read"
    return (f"{_src(call.func)}(...) (line {call.lineno}) copies it into the elements of {out}, a list made in "
            f"this function, and every later use of them reads a part ({what}), whose bounds the audit does not "
            "compare with the written part: no reader of the unwritten part is shown")
