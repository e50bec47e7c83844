"""Writes through an index the audit cannot bound (:func:`workbook.audit.certainty._certainty`).

A write whose index is a slice (``x[:n]``, ``x[a:b, 1]``) or a constant (``x[0]``, ``x[:, 1]``, a name
assigned one integer once) places a part of the buffer the rules can read. A write whose index is any
other expression is *advanced indexing*: ``x[idx] = v``, ``x[idx, :] = v``, ``x[mask] = v``,
``x[:, perm] = v``, or a method that writes through an index tensor or a mask (``x.index_copy_(0, idx,
v)``, ``x.scatter_(...)``, ``x.index_put_(...)``, ``x.masked_fill_(...)``). Such an index may be a
tensor, so the write may touch any part of the buffer (a permutation of ``0..63`` written into
``empty(64)`` writes all of it). It cannot leave a gap that is proven: a reverse risk after it is at
most low, and says which write it is. It proves no whole write either: the regions of
:mod:`workbook.audit.regions` are not widened, so a zero fill is never judged redundant on its account.
"""
from __future__ import annotations

import ast

from .regions import _norm
from .source import _src

# methods that write the buffer at places an index tensor or a mask picks
_INDEXED_WRITERS = {"index_copy_", "index_put_", "index_fill_", "scatter_", "scatter_add_", "scatter_reduce_",
                    "masked_fill_", "masked_scatter_", "put_", "index_add_", "index_reduce_"}


def _indexed_writer(par, call) -> bool:
    """``var.index_copy_(...)`` and the like: ``par`` the attribute, ``call`` its parent."""
    return isinstance(par, ast.Attribute) and par.attr in _INDEXED_WRITERS and isinstance(call, ast.Call) \
        and call.func is par


def _constant(e, env: dict) -> bool:
    """An index the rules place: a slice, ``...``, ``None``, an integer (``-1`` included), or a name
    whose one assignment makes it an integer (``k = 3``)."""
    if isinstance(e, ast.Slice) or isinstance(e, ast.Constant) and (e.value is Ellipsis or e.value is None):
        return True
    if isinstance(e, ast.Constant):
        return isinstance(e.value, int) and not isinstance(e.value, bool)
    if not isinstance(e, (ast.Name, ast.Attribute, ast.BinOp, ast.UnaryOp)):
        return False
    return _norm(e, env).lstrip("-").isdigit()


def _unbounded_index(sl, env: dict) -> str | None:
    """The part of the index ``sl`` (of ``var[sl]``, or a method call that writes through an index) that
    may be a tensor or a mask, as text, or None when every part is a slice or a constant."""
    if isinstance(sl, ast.Call):
        return sl.func.attr if isinstance(sl.func, ast.Attribute) else _src(sl.func)
    elts = list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]
    bad = [e for e in elts if not _constant(e, env)]
    return _src(bad[0]) if bad else None


def _unbounded_why(stmt, sl, env: dict) -> str | None:
    """Why a straight-line write leaves no proven gap: it writes through an index the audit cannot
    bound (``kperm[tau64] = s``), so it may cover any part of the buffer; or None."""
    idx = _unbounded_index(sl, env)
    if idx is None:
        return None
    how = f"with {idx} at the places its index tensor or mask picks" if isinstance(sl, ast.Call) else \
        f"through the index {idx}, which may be a tensor or a mask"
    return (f"{_src(stmt)[:80]} (line {stmt.lineno}) writes {how}: the audit cannot bound which part it "
            "covers, so it may write the rest")
