"""A zero fill of a *padded* allocation written by a Triton launch whose grid is bounded by the real
count (:func:`padding_unreached`), or of a literal size larger than a one-program launch stores.

A dimension is padded when its size is a count rounded up: ``(n + 31) // 32 * 32``, ``triton.cdiv(n,
32) * 32``, ``-(-n // 32) * 32``, ``math.ceil(n / 32) * 32``, ``round_up(n, 32)``, or a count of
blocks ``(n + 31) // 32`` / ``cdiv(n, 32)`` (the 32 rows of each block folded into another dimension),
written in the allocation or in the assignments its names come from (a shape tuple built earlier
included). A kernel launched over the real count (``grid = (n,)``, ``(n * b,)``) stores what the real
rows give; the rows ``[n, rounded)`` keep their zeros unless the kernel's grid is shown to reach the
rounded size: the grid names the padded size (or the buffer's own shape), or rounds the same count
itself (``cdiv(n, BLOCK)``: a grid of blocks). Where that is not shown, the zero fill is at most low,
and the reason names the padded dimension and the grid: "bounded by the real count" only where the
grid names the count that is rounded up (a persistent grid ``(num_sms,)`` names none: it is only "not
shown to reach the rounded size").

A launch of one program (:func:`extent_unreached`: ``k[(1,)](.., B)``) whose every store of the buffer
has an address of constants and literal ``tl.arange`` terms only (``B + tl.arange(0, 64)``: no program
id, no loop variable) reaches that many elements; an allocation of a larger literal size
(``torch.zeros(128)``) keeps its zeros past them: the zero fill is at most low, and the reason names
the stored extent and the size.
"""
from __future__ import annotations

import ast

from .callees import _is_jit
from .kernel_use import _tainted
from .offsets import store_extent
from .regions import _PAD_NAME, _alloc_shape, _assignments
from .source import _call_name, _params, _src


def _names(e) -> set[str]:
    return {n.id for n in ast.walk(e) if isinstance(n, ast.Name)}


def _roundings(expr) -> list[tuple[ast.AST, set]]:
    """The roundings up in ``expr``, each with the names of the count it rounds (empty when unknown)."""
    out = []
    for n in ast.walk(expr):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.FloorDiv) and isinstance(n.left, ast.BinOp) \
                and isinstance(n.left.op, (ast.Add, ast.Sub)):
            out.append((n, _names(n.left) - _names(n.right)))          # (n + k - 1) // k
        elif isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub) and isinstance(n.operand, ast.BinOp) \
                and isinstance(n.operand.op, ast.FloorDiv) and isinstance(n.operand.left, ast.UnaryOp):
            out.append((n, _names(n.operand.left)))                      # -(-n // k)
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitAnd) and any(
                isinstance(s, ast.UnaryOp) and isinstance(s.op, ast.Invert) for s in ast.walk(n)):
            out.append((n, _names(n.left) - _names(n.right)))          # (n + k) & ~k
        elif isinstance(n, ast.Call) and _PAD_NAME.search(_call_name(n) or "") and n.args:
            first = n.args[0]
            if isinstance(first, ast.BinOp) and isinstance(first.op, ast.Div):
                first = first.left                                        # math.ceil(n / k)
            out.append((n, _names(first)))
        elif isinstance(n, ast.Name) and _PAD_NAME.search(n.id):
            out.append((n, set()))                                        # M_pad, padded_rows: said so
    return out


def _resolve(exprs: list, by_name: dict, before: int, depth: int = 3):
    """``exprs`` and the values assigned (before line ``before``) to the names in them, ``depth`` steps
    back: yields (expression, the names it was reached through)."""
    seen: set[str] = set()
    level = [(e, frozenset()) for e in exprs]
    for _ in range(depth + 1):
        nxt = []
        for e, via in level:
            yield e, via
            for name in sorted(_names(e) - seen):
                seen.add(name)
                for line, value in by_name.get(name, ()):
                    if line < before:
                        nxt.append((value.body if isinstance(value, ast.Lambda) else value, via | {name}))
        level = nxt


def _padded_dims(call: ast.Call, by_name: dict, before: int) -> list[tuple[int, str, str, set, set]]:
    """Per padded dimension: (index, its size as written, the rounding, the rounded count's names, the
    names the size was reached through)."""
    dims = _alloc_shape(call) or []
    if len(dims) == 1 and isinstance(dims[0], ast.Name):        # torch.zeros(shape): a tuple built earlier
        built = [v for line, v in by_name.get(dims[0].id, ()) if line < before]
        if len(built) == 1 and isinstance(built[0], (ast.Tuple, ast.List)):
            dims = list(built[0].elts)
    out = []
    for i, d in enumerate(dims):
        for e, via in _resolve([d], by_name, before):
            hits = _roundings(e)
            if hits:
                node, counts = hits[0]
                size = _src(d) if e is d else f"{_src(d)} = {_src(e)}"
                out.append((i, size, _src(node), counts, set(via)))
                break
    return out


def _launch_at(fn, var: str, line: int) -> ast.Call | None:
    for n in ast.walk(fn.node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript) \
                and n.lineno <= line <= (n.end_lineno or n.lineno) \
                and any(var in _names(a) for a in list(n.args) + [k.value for k in n.keywords]):
            return n
    return None


def _grid_exprs(fn, grid, before: int) -> list:
    exprs = [grid]
    for d in ast.walk(fn.node):
        if isinstance(d, ast.FunctionDef) and d is not fn.node and isinstance(grid, ast.Name) and d.name == grid.id:
            exprs += [r.value for r in ast.walk(d) if isinstance(r, ast.Return) and r.value is not None]
    return exprs


def padding_unreached(fn, var: str, call: ast.Call | None, use, before: int) -> str | None:
    """The reason a zero fill written by a launch is not shown whole because of padding: the allocation
    has a padded dimension and the launch's grid is not shown to reach the rounded size; else None."""
    if call is None or use.kind != "write" or not use.how.startswith("Triton launch"):
        return None
    launch = _launch_at(fn, var, use.line)
    if launch is None:
        return None
    by_name = _assignments(fn.stmts)
    dims = _padded_dims(call, by_name, before)
    if not dims:
        return None
    grid = list(_resolve(_grid_exprs(fn, launch.func.slice, launch.lineno), by_name, launch.lineno))
    grid_names = set().union(*(_names(e) | via for e, via in grid))
    grid_counts = set().union(*(c for e, _ in grid for _, c in _roundings(e)))
    for i, size, rounding, counts, via in dims:
        if var in grid_names or via & grid_names or (counts and counts & grid_counts):
            continue                                   # the grid names the padded size, or rounds the count too
        real = ", ".join(sorted(counts)) or "a count"
        shown = _src(launch.func.slice)
        if len(grid) > 1 and isinstance(launch.func.slice, ast.Name):
            shown += f" = {_src(grid[1][0])}"
        bound = "is bounded by the real count, not shown" if counts & grid_names else "is not shown"
        return (f"dimension {i} is padded ({size}: {rounding} rounds {real} up) while the launch's grid "
                f"({shown}) {bound} to reach the rounded size: the padding the kernel does not store keeps "
                f"its zeros")
    return None


def _one_program(fn, grid, before: int) -> str | None:
    """The launch grid as shown when it is literally one program (``(1,)``, ``(1, 1, 1)``, ``[1]``,
    ``1``, or a name assigned one of them), else None."""
    shown = _src(grid)
    if isinstance(grid, ast.Name):
        vals = [v for line, v in _assignments(fn.stmts).get(grid.id, ()) if line < before]
        grid = vals[-1] if len(vals) == 1 else None
        shown += f" = {_src(grid)}" if grid is not None else ""
    elts = grid.elts if isinstance(grid, (ast.Tuple, ast.List)) else [grid]
    one = grid is not None and bool(elts) and all(isinstance(e, ast.Constant) and e.value == 1 for e in elts)
    return shown if one else None


def _param_of(launch: ast.Call, kern, var: str) -> str | None:
    for k in launch.keywords:
        if isinstance(k.value, ast.Name) and k.value.id == var:
            return k.arg
    params = _params(kern.node)
    for i, a in enumerate(launch.args):
        if isinstance(a, ast.Starred):
            return None
        if isinstance(a, ast.Name) and a.id == var:
            return params[i] if i < len(params) else None
    return None


def _reach(kern, param: str) -> tuple[int, str] | None:
    """The most elements any store of ``param`` in ``kern`` reaches, and that store's address; None
    when one of them is not of constants and literal aranges, or the pointer goes to a helper."""
    body = list(ast.walk(kern.node))
    taint = _tainted(body, param)
    best = None
    for n in body:
        if not isinstance(n, ast.Call) or not any(_names(a) & taint for a in n.args):
            continue
        name = _call_name(n)
        if name == "load":
            continue
        if name != "store" or not (_names(n.args[0]) & taint):
            return None                    # an atomic, a helper given the pointer, a store through another
        got = store_extent(kern, n.args[0], taint)
        if got is None:
            return None
        best = got if best is None or got[0] > best[0] else best
    return best


def extent_unreached(project, fn, var: str, call: ast.Call | None, use) -> str | None:
    """The reason a zero fill of a literal size written by a launch of one program is not shown whole:
    every store of the buffer reaches fewer elements than the allocation holds; else None."""
    if call is None or use.kind != "write" or not use.how.startswith("Triton launch"):
        return None
    dims = _alloc_shape(call) or []
    if not dims or not all(isinstance(d, ast.Constant) and type(d.value) is int for d in dims):
        return None
    size = 1
    for d in dims:
        size *= d.value
    launch = _launch_at(fn, var, use.line)
    grid = _one_program(fn, launch.func.slice, launch.lineno) if launch is not None else None
    if grid is None:
        return None
    kernels = [k for k in project.resolve_all(_call_name(launch), fn.file)[0] if _is_jit(k.node)]
    param = _param_of(launch, kernels[0], var) if len(kernels) == 1 else None
    got = _reach(kernels[0], param) if param is not None else None
    if got is None or got[0] >= size:
        return None
    return (f"the launch's grid ({grid}) is one program and every store of param '{param}' "
            f"reaches at most {got[0]} elements (its store address ({got[1]}) has no program id and no loop "
            f"variable) while {var} holds {size} ({_src(call.func)}({', '.join(_src(d) for d in dims)}, ...)): "
            f"elements [{got[0]}, {size}) keep their zeros")
