"""The audit's sites: which statements of a function are zero fills (or ``empty`` allocations), and
what the first use of each makes of it (:mod:`workbook.audit.analyzer` follows the buffer): a finding
with its proof obligation, a zero fill judged necessary (with the reason), or an allocation helper
whose callers in the files decide (:func:`_follow_helpers`). :func:`workbook.audit.driver.audit_sources`
runs it all over a set of sources, parsing only the functions that hold a candidate."""
from __future__ import annotations

import ast
import re

from .analyzer import _Analyzer, _min_conf, _Project, _slice_bounds, _Use
from .results import Finding
from .source import _call_name, _dotted, _Func, _hit_lines, _is_whole_slice, _is_zero, _src

# ---- the fills ------------------------------------------------------------------------------------
_ZERO_CTORS = {"zeros", "zeros_like", "new_zeros"}
_FULL_CTORS = {"full": 1, "full_like": 1, "new_full": 1}        # index of the fill value (after the receiver)
_EMPTY_CTORS = {"empty", "empty_like", "new_empty", "empty_strided"}
_PAD_NAME = re.compile(r"round_up|roundup|cdiv|ceil|align|pad|next_power_of_2|next_multiple|multiple_of",
                       re.IGNORECASE)


def _fill_pattern(call: ast.Call) -> str | None:
    """The zero-fill pattern a call expression is, or None."""
    name = _call_name(call)
    if isinstance(call.func, ast.Subscript):
        return None
    recv = _dotted(call.func.value) if isinstance(call.func, ast.Attribute) else None
    if name in _ZERO_CTORS:
        if name == "new_zeros" or recv in (None, "torch") or (recv or "").endswith("torch"):
            return f"{'torch.' if name != 'new_zeros' else '.'}{name}"
        return None
    if name in _FULL_CTORS:
        idx = 0 if name == "new_full" else 1
        val = call.args[idx] if len(call.args) > idx else next((k.value for k in call.keywords if k.arg == "fill_value"), None)
        if val is not None and _is_zero(val) and (name == "new_full" or recv in (None, "torch") or (recv or "").endswith("torch")):
            return f"{'torch.' if name != 'new_full' else '.'}{name}(.., 0)"
    return None


def _empty_pattern(call: ast.Call) -> str | None:
    name = _call_name(call)
    if isinstance(call.func, ast.Subscript) or name not in _EMPTY_CTORS:
        return None
    recv = _dotted(call.func.value) if isinstance(call.func, ast.Attribute) else None
    if name.startswith("new_") or recv in (None, "torch") or (recv or "").endswith("torch"):
        return f"{'torch.' if not name.startswith('new_') else '.'}{name}"
    return None


def _padded(call: ast.Call) -> bool:
    """Does the allocation's shape look padded (round_up, cdiv, align, pad, ...)?"""
    for a in list(call.args) + [k.value for k in call.keywords if k.arg in (None, "size")]:
        for n in ast.walk(a):
            name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
            if name and _PAD_NAME.search(name):
                return True
    return False


def _short(s: str, n: int = 240) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


# ---- the audit ------------------------------------------------------------------------------------

def _site_obligation(kind, var, pattern, use: _Use, padded: bool) -> str:
    if kind == "empty-partial-write":
        return (f"the slices {', '.join(use.partial_writes)} must together cover every element of {var} that "
                f"any consumer reads (show the bound equals the allocated length, e.g. no padded tokens), "
                f"or allocate only what is written")
    parts = []
    if use.partial_writes:
        parts.append(f"the slices {' and '.join(use.partial_writes)} must be disjoint and cover [0, len) of "
                     f"the first dimension of {var}")
    elif "Triton launch" in use.how or "custom op" in use.how or "->" in use.how:
        parts.append(f"the callee must write every element of {var} for every shape it is called with "
                     "(check the grid covers all rows/blocks and the store masks drop nothing)")
    else:
        parts.append(f"the assignment must write every element of {var} (same shape, no broadcasting into a "
                     "subset)")
    if padded:
        parts.append("the allocation is PADDED: padding must be written too if any consumer reads whole tiles, "
                     "or shown unread (consumer differential)")
    if use.view:
        parts.append("the write goes through a VIEW: storage outside the view stays unwritten; show no consumer "
                     "reads it (coverage map of the whole storage)")
    if use.conditional:
        parts.append("the write is CONDITIONAL: every path must write it before it is read")
    return "; ".join(parts)


def _analyze_function(project: _Project, fn: _Func, findings: list[Finding], necessary: list[dict],
                      helper_sites: list):
    an = _Analyzer(project, fn)
    for node in fn.stmts:
        var, pattern, call, kind = None, None, None, None
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and _dotted(targets[0]):
                call = node.value
                pattern = _fill_pattern(call)
                kind = "zero-fill-then-overwrite"
                if pattern is None:
                    pattern = _empty_pattern(call)
                    kind = "empty-partial-write"
                var = _dotted(targets[0])
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute):
            c = node.value
            if c.func.attr == "zero_" or (c.func.attr == "fill_" and c.args and _is_zero(c.args[0])):
                var = _dotted(c.func.value)
                pattern, call, kind = f".{c.func.attr}({'0' if c.args else ''})", None, "zero-fill-then-overwrite"
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript) \
                and _is_whole_slice(node.targets[0].slice) and _is_zero(node.value):
            var = _dotted(node.targets[0].value)
            pattern, call, kind = "[:] = 0", None, "zero-fill-then-overwrite"
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Call) and _fill_pattern(node.value):
            # an allocation helper returning a fresh zero fill: judged by what its callers do
            helper_sites.append((fn, node, "the returned buffer", _fill_pattern(node.value), _padded(node.value),
                                 _Use("return", node.lineno, "return")))
            continue
        if not var or not pattern:
            continue
        use = an.first_use(var, node, node)
        padded = bool(call is not None and _padded(call))
        rel = fn.file
        if kind == "empty-partial-write":
            # only slices with a bound, written once (a loop over rows/experts usually fills everything)
            if use.kind == "partial" and use.partial_writes and not use.in_loop \
                    and any(":" in h.split("=")[0] for h in use.partial_writes):
                alloc_dim = _src(call.args[0]) if call.args else None
                bounds = [_slice_bounds(h) for h in use.partial_writes]
                if alloc_dim and all(b and b[0] == "" and b[1] == alloc_dim for b in bounds):
                    continue   # out[:n] = ... with out = empty(n, ...): the slice is the whole length
                findings.append(Finding(rel, node.lineno, fn.qualname, var, kind, pattern, _short(use.how),
                                        "medium", [f"only written through slices: {_short(use.how)} (line {use.line})"],
                                        _site_obligation(kind, var, pattern, use, padded), padded, use.view, True,
                                        _src(node)))
            continue
        if use.kind == "write":
            conf = use.confidence
            reasons = [f"first use after the fill overwrites it (line {use.line})"]
            if use.conditional:
                conf = _min_conf(conf, "medium")
                reasons.append("the overwrite is under a condition/loop the fill is not under")
            findings.append(Finding(rel, node.lineno, fn.qualname, var, kind, pattern, f"{_short(use.how)} [line {use.line}]",
                                    conf, reasons, _site_obligation(kind, var, pattern, use, padded), padded,
                                    use.view, bool(use.partial_writes), _src(node)))
        elif use.kind == "return" and isinstance(node, (ast.Assign, ast.AnnAssign)):
            helper_sites.append((fn, node, var, pattern, padded, use))
        elif use.kind in ("accumulate", "read", "partial"):
            necessary.append({"file": rel, "line": node.lineno, "function": fn.qualname, "variable": var,
                              "pattern": pattern, "why": f"{use.kind}: {use.how} (line {use.line})"})


def _enclosing_def(node, parents):
    n = parents.get(node)
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        n = parents.get(n)
    return n


def _follow_helpers(project: _Project, helper_sites, findings, necessary):
    """An allocation helper returns a zero-filled buffer: what do its callers (in the files) do with it?"""
    by_name: dict[str, list] = {}
    for site in helper_sites:
        if len(project.index.get(site[0].node.name, [])) <= 1:   # an ambiguous name cannot be followed
            by_name.setdefault(site[0].node.name, []).append(site)
    if not by_name:
        return
    callers: dict[str, list[tuple[_Func, ast.AST, str]]] = {n: [] for n in by_name}
    call_re = re.compile(r"\b(" + "|".join(map(re.escape, by_name)) + r")\s*\(")
    seen: set[int] = set()
    for src in project.sources.values():
        if src.broken:
            continue
        for line0 in _hit_lines(src, call_re):
            d = src.enclosing_def(line0)
            if d is None:
                continue
            for fn in project.load(src.name, d[0], d[1]):
                if id(fn.node) in seen:
                    continue
                seen.add(id(fn.node))
                for node in ast.walk(fn.node):
                    if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call) \
                            and _call_name(node.value) in by_name and _enclosing_def(node, fn.parents) is fn.node:
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        if len(targets) != 1:
                            continue
                        t = targets[0]
                        if _dotted(t):
                            callers[_call_name(node.value)].append((fn, node, _dotted(t), None))
                        elif isinstance(t, ast.Tuple):
                            for i, e in enumerate(t.elts):
                                if _dotted(e):
                                    callers[_call_name(node.value)].append((fn, node, _dotted(e), i))
    for name, sites in by_name.items():
        if len(project.index.get(name, [])) > 1:
            continue  # ambiguous helper name
        for hfn, node, var, pattern, padded, ret in sites:
            uses = []
            for cfn, cnode, cvar, idx in callers[name]:
                if idx != ret.return_index:
                    continue
                u = _Analyzer(project, cfn).first_use(cvar, cnode, cnode)
                uses.append((cfn, cnode, u))
            if not uses:
                continue
            if all(u.kind == "write" for _, _, u in uses):
                conf = "medium"
                if any(u.confidence == "low" for _, _, u in uses):
                    conf = "low"
                how = "; ".join(f"caller {c.qualname} ({c.file}:{n.lineno}): {u.how}" for c, n, u in uses[:3])
                use = uses[0][2]
                use.view = use.view or ret.view
                findings.append(Finding(hfn.file, node.lineno, hfn.qualname, var, "zero-fill-then-overwrite", pattern,
                                        _short(f"returned by helper {name}(); {how}", 400), conf,
                                        [f"allocation helper: all {len(uses)} caller(s) in the files overwrite it",
                                         "callers outside the files given are not seen"],
                                        _site_obligation("zero-fill-then-overwrite", var, pattern, use, padded)
                                        + f"; and every caller of {name}() must do so", padded, use.view,
                                        bool(use.partial_writes), _src(node)))
            else:
                bad = next(u for _, _, u in uses if u.kind != "write")
                necessary.append({"file": hfn.file, "line": node.lineno, "function": hfn.qualname, "variable": var,
                                  "pattern": pattern, "why": f"a caller of {name}(): {bad.kind}: {bad.how}"})
