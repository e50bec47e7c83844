"""The audit's sites: which statements of a function are zero fills (or ``empty`` allocations), plain,
in a branch of a conditional expression (``x = zeros(..) if x is None else x``: at most medium) or in
a tuple unpacked into names (``a, b = zeros(..), empty(..)``), and what the first use of each makes of it (:mod:`workbook.audit.analyzer` follows the buffer): a finding
with its proof obligation, a zero fill judged necessary (with the reason), or an allocation helper
whose callers in the files decide (:func:`_follow_helpers`); a zero fill whose buffer goes where the
analysis cannot follow is a low ``trail-lost`` finding, and an ``empty`` buffer is a reverse risk
only when part of it is neither shown written nor shown unread (:func:`_judge_empty`). Each site is
judged once (a nested def is loaded with its enclosing def and alone), and a finding whose allocation
carries ``# audit: ok -- <why>`` is suppressed with its reason (:func:`_emit`; without a reason it is
reported, low). :func:`workbook.audit.driver.audit_sources` runs it all over a set of sources, parsing
only the functions that hold a candidate."""
from __future__ import annotations

import ast
import re

from .analyzer import _Analyzer, _min_conf, _Project, _Use
from .caller_reads import callers_read_parts, flag_never_set
from .certainty import _certainty, _kept_in_field
from .gathered import gathered_parts
from .padded_launch import extent_unreached, padding_unreached
from .rmw_launch import rmw_cover
from .regions import _alloc_shape, _branch_groups, _env, _gap, _independent_writes, _padding
from .results import Finding
from .source import _call_lines, _call_name, _dotted, _Func, _is_whole_slice, _is_zero, _src

# ---- the fills ------------------------------------------------------------------------------------
_ZERO_CTORS = {"zeros", "zeros_like", "new_zeros"}
_FULL_CTORS = {"full": 1, "full_like": 1, "new_full": 1}        # index of the fill value (after the receiver)
_EMPTY_CTORS = {"empty", "empty_like", "new_empty", "empty_strided"}


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


def _short(s: str, n: int = 240) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


# ---- suppressions: "# audit: ok -- <why>" where the buffer is allocated -----------------------------

_SUPPRESS = re.compile(r"#\s*audit:\s*ok\b(.*)$", re.IGNORECASE)


def _suppression(project: _Project, file: str, node) -> str | None:
    """The reason of an ``# audit: ok -- <why>`` comment on the statement's lines or on the comment
    lines just above it: None when there is none, '' when it gives no reason."""
    src = project.sources.get(file)
    if src is None:
        return None
    lines = src.lines
    texts = lines[node.lineno - 1: (node.end_lineno or node.lineno)]
    k = node.lineno - 2
    while k >= 0 and node.lineno - 2 - k < 3 and lines[k].strip().startswith("#"):
        texts.append(lines[k])
        k -= 1
    for text in texts:
        m = _SUPPRESS.search(text)
        if m:
            why = re.match(r"\s*--\s*(\S.*)$", m.group(1))
            return why.group(1).strip() if why else ""
    return None


def _emit(project: _Project, findings: list[Finding], f: Finding, node) -> None:
    """Report ``f``, unless its allocation carries ``# audit: ok -- <why>``: then it is suppressed, with
    the reason; a suppression without a reason is itself reported (low)."""
    why = _suppression(project, f.file, node)
    if why is None:
        findings.append(f)
    elif why:
        project.suppressed.append({"file": f.file, "line": f.line, "where": f.where, "function": f.function,
                                   "variable": f.variable, "kind": f.kind, "confidence": f.confidence, "reason": why,
                                   "reasons": f.reasons})
    else:
        f.reasons = ["suppression without a reason: write '# audit: ok -- <why>'",
                     f"(the finding it hides, {f.confidence}: {f.kind})"] + f.reasons
        f.kind, f.confidence = "suppression-without-reason", "low"
        findings.append(f)


# ---- the audit ------------------------------------------------------------------------------------

def _site_obligation(kind, var, pattern, use: _Use, padded: str | None) -> str:
    if kind == "empty-partial-write":
        return (f"the slices {', '.join(use.partial_writes)} must together cover every element of {var} that "
                f"some consumer reads into a result someone keeps ({use.consumer}): show the bound equals the "
                f"allocated length (no padded tokens) or that no consumer reads the rest into a kept result, or "
                f"hand on only the written part, or allocate only what is written")
    if kind == "trail-lost":
        return (f"follow {var} by hand from line {use.line}: if every element is overwritten before any read, the "
                "zero fill is redundant; if it is read or added into, keep it")
    parts = []
    if use.partial_writes:
        parts.append(f"the slices {' and '.join(use.partial_writes)} must be disjoint and cover every element of "
                     f"{var} (their bounds as written)")
    elif "collective" in use.how:
        parts.append(f"the collective's output must be exactly {var} (world size times the input, contiguous), "
                     "on every rank")
    elif "Triton launch" in use.how or "custom op" in use.how or "->" in use.how or "out=" in use.how:
        parts.append(f"the callee must write every element of {var} for every shape it is called with "
                     "(check the grid covers all rows/blocks and the store masks drop nothing)")
    else:
        parts.append(f"the assignment must write every element of {var} (same shape, no broadcasting into a "
                     "subset)")
    if padded:
        parts.append(f"the allocation is PADDED ({padded}): padding must be written too if any consumer reads "
                     "whole tiles, or shown unread (consumer differential)")
    if use.view:
        parts.append("the write goes through a VIEW: storage outside the view stays unwritten; show no consumer "
                     "reads it (coverage map of the whole storage)")
    if use.conditional:
        parts.append("the write is CONDITIONAL: every path must write it before it is read")
    return "; ".join(parts)


def _site_of(node) -> tuple | None:
    """``(variable, pattern, allocation call or None, kind)`` when statement ``node`` is a zero fill or
    an ``empty`` allocation, else None."""
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
    return (var, pattern, call, kind) if var and pattern else None


def _branches(target, value, conds: tuple = ()):
    """``(target, expression, conditional expressions it is under)`` for each part of an assignment
    ``target = value``: each branch of a conditional expression (``a if c else b``), each element of a
    tuple/list literal unpacked into as many targets (``a, b = x, y``); the rest whole."""
    if isinstance(value, ast.IfExp):
        yield from _branches(target, value.body, conds + ((value, value.orelse),))
        yield from _branches(target, value.orelse, conds + ((value, value.body),))
    elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(value.elts) \
            and not any(isinstance(e, ast.Starred) for e in target.elts + value.elts):
        for t, v in zip(target.elts, value.elts):
            yield from _branches(t, v, conds)
    else:
        yield target, value, conds


def _refill_pattern(e) -> str | None:
    """``x.zero_()`` / ``x.fill_(0)`` as an expression (a branch of a conditional expression)."""
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and _dotted(e.func.value) and \
            (e.func.attr == "zero_" or (e.func.attr == "fill_" and e.args and _is_zero(e.args[0]))):
        return f"{_dotted(e.func.value)}.{e.func.attr}({'0' if e.args else ''})"
    return None


def _sites_of(node) -> list[tuple]:
    """The sites of statement ``node``: ``(variable, pattern, allocation call or None, kind, note)``;
    ``note`` (a conditional allocation) is None for a plain one. An allocation in a branch of a
    conditional expression or in a tuple unpacked into names is a site of its own target; one in such
    a place whose target is no name (``a[i], b = ...``) or whose value is not followed
    (``f(torch.zeros(n)) if c else y``) is a ``lost`` site: the trail is lost there (never skipped)."""
    site = _site_of(node)
    if site is not None:
        return [site + (None,)]
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or not isinstance(node.value, (ast.IfExp, ast.Tuple, ast.List)):
        return []
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    merged: dict[tuple, list] = {}
    for t, v, conds in _branches(targets[0] if len(targets) == 1 else None, node.value):
        call = v if isinstance(v, ast.Call) else None
        pattern = call is not None and _fill_pattern(call)
        kind = "zero-fill-then-overwrite"
        if not pattern and call is not None:
            pattern, kind = _empty_pattern(call), "empty-partial-write"
        if not pattern and conds:
            pattern, call, kind = _refill_pattern(v), None, "zero-fill-then-overwrite"
        if not pattern:
            inner = next((c for c in ast.walk(v) if isinstance(c, ast.Call) and _fill_pattern(c)), None)
            if conds and inner is not None:       # a zero fill inside a branch, not the branch itself
                merged[(_src(t) if t is not None else "?", "lost")] = [
                    _fill_pattern(inner), inner, "lost", f"the zero fill {_src(inner)} is inside {_src(v)}, a branch "
                    f"of the conditional expression {_src(conds[-1][0])}: where the buffer goes is not followed"]
            continue
        var = _dotted(t) if t is not None else None
        if var is None and kind == "empty-partial-write":
            continue                              # as for a plain statement: an empty is no trail to lose
        if var is None:
            merged[(_src(t) if t is not None else "?", "lost")] = [
                pattern, call, "lost", f"{pattern} is assigned to {_src(t) if t is not None else 'several targets'} "
                f"in {_src(node)}: a target that is no name is not followed"]
            continue
        site = merged.setdefault((var, kind), [None, call, kind, None, []])
        site[0] = pattern if site[0] is None else f"{site[0]} / {pattern}"
        site[1] = site[1] if site[1] is not None else call
        site[4].append(conds)
    return [(var, *m[:3], m[3] if m[2] == "lost" else _conditional_note(m[0], m[4], m[2]))
            for (var, _), m in merged.items()]


def _conditional_note(pattern: str, conds_of: list, kind: str) -> str | None:
    """What a conditional allocation's finding must say: which branches allocate, and that the other
    branch of the conditional expression may hand on a buffer this statement does not allocate."""
    if not any(conds_of):
        return None
    ifexp, other = next(c for c in conds_of if c)[-1]
    fresh = isinstance(other, ast.Call) and (_fill_pattern(other) or _empty_pattern(other))
    if sum(1 for c in conds_of if c) > 1:
        what = f"both branches fill it ({pattern}): a buffer filled in place may be one the caller passed"
    elif fresh:
        what = f"the other branch allocates it otherwise ({_src(other)})"
    else:
        what = f"the other branch hands on {_src(other)}, not allocated here" + \
            (" (a caller's buffer, say)" if _dotted(other) else "")
    tail = "at most medium for a zero fill" if kind == "zero-fill-then-overwrite" else "judged where this branch runs"
    return f"a conditional allocation: {_src(ifexp)} (line {ifexp.lineno}); {what}; {tail}"


def _first_visit(project: _Project, fn: _Func, node, var: str) -> bool:
    """A site is analyzed once: a nested def is loaded with its enclosing def and on its own."""
    key = (fn.file, node.lineno, node.col_offset, var)
    if key in project.sites_done:
        return False
    project.sites_done.add(key)
    return True


def _analyze_function(project: _Project, fn: _Func, findings: list[Finding], necessary: list[dict],
                      helper_sites: list):
    an = _Analyzer(project, fn)
    for node in fn.stmts:
        if an.unreachable(node):
            continue                       # after a return/raise/continue/break: never runs
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Call) and _fill_pattern(node.value):
            # an allocation helper returning a fresh zero fill: judged by what its callers do
            if _first_visit(project, fn, node, "<return>"):
                helper_sites.append((fn, node, "the returned buffer", _fill_pattern(node.value),
                                     _padding(node.value, fn.stmts, node.lineno), _Use("return", node.lineno, "return")))
            continue
        if isinstance(node, ast.Return) and isinstance(node.value, ast.IfExp):
            _conditional_return(project, fn, node, helper_sites)
            continue
        for var, pattern, call, kind, note in _sites_of(node):
            if not _first_visit(project, fn, node, var if note is None else f"{var}|{kind}"):
                continue
            padded = _padding(call, fn.stmts, node.lineno) if call is not None else None
            if kind == "lost":
                use = _Use("escape", node.lineno, note, "low")
                _judge_zero_fill(project, fn, node, var, pattern, use, padded, findings, necessary, helper_sites)
                continue
            use = an.first_use(var, node, node, alloc=call)
            if kind == "empty-partial-write":
                _judge_empty(project, fn, node, var, pattern, call, use, padded, findings, note)
            else:
                unreached = padding_unreached(fn, var, call, use, node.lineno) or \
                    extent_unreached(project, fn, var, call, use)
                _judge_zero_fill(project, fn, node, var, pattern, use, padded, findings, necessary, helper_sites, note,
                                 unreached)


def _conditional_return(project: _Project, fn: _Func, node, helper_sites: list) -> None:
    """``return torch.zeros(..) if c else x``: an allocation helper on the branches that zero-fill
    (its callers decide, as for a plain ``return torch.zeros(..)``)."""
    for _, value, _ in _branches(None, node.value):
        pattern = isinstance(value, ast.Call) and _fill_pattern(value)
        if pattern and _first_visit(project, fn, node, f"<return>|{value.col_offset}"):
            helper_sites.append((fn, node, "the returned buffer", f"{pattern} (a branch of {_src(node.value)})",
                                 _padding(value, fn.stmts, node.lineno), _Use("return", node.lineno, "return")))


def _judge_zero_fill(project, fn, node, var, pattern, use: _Use, padded, findings, necessary, helper_sites,
                     note: str | None = None, unreached: str | None = None):
    """A zero fill's finding, or a necessary fill, or an allocation helper (``note``: a conditional
    allocation, at most medium, and the finding says why; ``unreached``: a padded dimension the writing
    launch's grid is not shown to reach, or a literal size past what a one-program launch stores, at
    most low: :mod:`workbook.audit.padded_launch`)."""
    rel = fn.file
    if use.kind == "write" and use.how.endswith("zero-fills it again") and not isinstance(node, (ast.Assign, ast.AnnAssign)):
        # a fill statement filled again: a reset or a cache flush, not an allocation to be made empty
        necessary.append({"file": rel, "line": node.lineno, "function": fn.qualname, "variable": var,
                          "pattern": pattern, "why": f"repeated fill: {use.how} (line {use.line})"})
    elif use.kind == "write":
        conf = use.confidence
        reasons = [f"first use after the fill overwrites it (line {use.line})"]
        if use.conditional:   # where the condition is false the zeros survive: they may be the result
            conf = _min_conf(conf, "low")
            reasons.append("the overwrite is under a condition/loop the fill is not under")
        if note:
            conf = _min_conf(conf, "medium")
            reasons.append(note)
        if unreached:
            conf = _min_conf(conf, "low")
            reasons.append(unreached)
        _emit(project, findings, Finding(rel, node.lineno, fn.qualname, var, "zero-fill-then-overwrite", pattern,
                                         f"{_short(use.how)} [line {use.line}]", conf, reasons,
                                         _site_obligation("zero-fill-then-overwrite", var, pattern, use, padded),
                                         bool(padded), use.view, bool(use.partial_writes), _src(node)), node)
    elif use.kind == "return" and isinstance(node, (ast.Assign, ast.AnnAssign)):
        helper_sites.append((fn, node, var, pattern, padded, use))
    elif use.kind in ("accumulate", "read", "partial", "return"):
        why = "return: the zeros are the function's result" if use.kind == "return" else f"{use.kind}: {use.how}"
        necessary.append({"file": rel, "line": node.lineno, "function": fn.qualname, "variable": var,
                          "pattern": pattern, "why": f"{why} (line {use.line})"})
    elif use.kind == "escape":
        _emit(project, findings, Finding(rel, node.lineno, fn.qualname, var, "trail-lost", pattern, _short(use.how),
                                         "low", [f"the trail is lost at line {use.line}: {_short(use.how)}",
                                                 "whether the zeros are read or overwritten there is not known"]
                                         + ([note] if note else []),
                                         _site_obligation("trail-lost", var, pattern, use, padded), bool(padded),
                                         use.view, False, _src(node)), node)


def _judge_empty(project, fn, node, var, pattern, call, use: _Use, padded, findings, note: str | None = None):
    """The reverse risk: an ``empty`` buffer written once through slices that do not provably cover it,
    and then used beyond them (returned, passed on, stored, kept); ``note``: a conditional allocation.
    Medium only when every write before the consumer is an unconditional, straight-line slice write with
    comparable bounds, a part is provably outside them all, and the consumer is one this function cannot
    see; anything less certain (a loop, an ``if``, a size a test picks, a trail lost in an attribute or a
    container kept there) is low with the reason (:func:`workbook.audit.certainty._certainty`)."""
    if use.kind != "partial" or use.in_loop or not use.consumer:
        return                          # covered, written in a loop, or the rest is never read here
    regions = [r for r in use.regions if r is not None]
    if not regions:
        return                          # written through index_copy_/narrow/...: the part is not read
    shape = _alloc_shape(call)
    env = _env(fn.stmts, fn.names, fn.consts)
    gaps = []
    for pinned, group in _branch_groups(regions, fn.parents, node):
        g = _gap(group, shape, pinned, env)
        other = _independent_writes(regions, fn.parents, node, group) if g[1] else []
        if other:          # a write under another, independent if may also run: the part is not shown unwritten
            g = (f"{g[0]} by the writes of one branch; {_src(fn.parents.get(other[0], other[0]))} under "
                 "another, independent if may write it", False)
        gaps.append(g)
    gap, strength = next((g for g in gaps if g[0] is not None), (None, False))
    if gap is None or not (strength or any(_has_slice(r) for r in regions)):
        return                          # every branch covers it, or only indexes of an unknown extent
    verdict, why = _certainty(fn, node, var, shape, env, regions, use.consumer_line)
    if verdict == "covered":
        return                          # with the writes in loops, or a size chosen by the writes' own test
    why = why or rmw_cover(project, fn, var, use, regions, shape, env)   # a launch that loads and stores it all
    why = why or callers_read_parts(project, fn, var, use)     # every caller in the files reads only parts
    why = why or flag_never_set(project, fn, var, use)         # the whole return runs under a flag none sets
    why = why or gathered_parts(fn, var, use)                  # all-gathered copies read only in part
    reasons = [f"only written through slices: {_short(use.how)} (line {use.line})",
               gap,
               f"the buffer is then used beyond them: {use.consumer}"] + ([note] if note else [])
    # medium only where a part is shown left unwritten (a missed index or stride, or the tail of a padded
    # dimension written on [0, n)); where the writes cannot be modelled (index tensors, views of unknown
    # size, several dimensions, a start not 0), the rest may well be covered: low, and says so
    conf = "medium" if strength else "low"
    # a buffer kept in an attribute (a cache, a scratch with headroom) or in a new object's field (a
    # constructor keyword) is read by code not followed: that the unwritten part is read is not shown
    kept = (use.consumer[8:].split(" beyond", 1)[0] if use.consumer.startswith("kept in ")
            else _kept_in_field(fn, var, use.consumer_line)) if strength else None
    if not strength:
        reasons.append("the audit cannot show which part stays unwritten (the writes are not a prefix of "
                       "one dimension of known size): check the writes by hand")
    elif kept:                          # so the trail is lost there (low)
        conf = "low"
        reasons.append(f"the trail is lost at {kept}: whether its readers go beyond the written part is not followed")
    if why is not None:                 # a write in a loop or under a condition: the gap is not proven
        conf = "low"
        reasons.append(f"the gap is not proven: {why}")
    _emit(project, findings, Finding(fn.file, node.lineno, fn.qualname, var, "empty-partial-write", pattern,
                                     _short(use.how), conf, reasons,
                                     _site_obligation("empty-partial-write", var, pattern, use, padded), bool(padded),
                                     use.view, True, _src(node)), node)


def _has_slice(sl) -> bool:
    return any(isinstance(e, ast.Slice) for e in (sl.elts if isinstance(sl, ast.Tuple) else [sl]))


def _enclosing_def(node, parents):
    n = parents.get(node)
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        n = parents.get(n)
    return n


def _helper_callers(project: _Project, by_name: dict) -> dict[str, list]:
    """Where the helpers ``by_name`` are called in the files: {name: [(function, statement, variable,
    index of the returned tuple or None)]}."""
    callers: dict[str, list[tuple[_Func, ast.AST, str, int | None]]] = {n: [] for n in by_name}
    seen: set[int] = set()
    for src in project.sources.values():
        if src.broken:
            continue
        for line0 in _call_lines(src, by_name):   # \bname\s*\(, any number of names in one fast scan
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
    return callers


def _follow_helpers(project: _Project, helper_sites, findings, necessary):
    """An allocation helper returns a zero-filled buffer: what do its callers (in the files) do with it?
    All overwrite it: a finding (medium); one reads it: necessary; none in the files: necessary (the
    zeros are what its callers get); one loses the trail: trail-lost (low)."""
    by_name: dict[str, list] = {}
    for site in helper_sites:
        if len(project.index.get(site[0].node.name, [])) <= 1:   # an ambiguous name cannot be followed
            by_name.setdefault(site[0].node.name, []).append(site)
        else:
            _returned(necessary, site, f"{site[0].node.name} has several definitions: its callers are not told apart")
    callers = _helper_callers(project, by_name) if by_name else {}
    for name, sites in by_name.items():
        for hfn, node, var, pattern, padded, ret in sites:
            uses = [(cfn, cnode, _Analyzer(project, cfn).first_use(cvar, cnode, cnode))
                    for cfn, cnode, cvar, idx in callers[name] if idx == ret.return_index]
            uses = [x for x in uses if x[2].kind != "none"]
            if not uses:
                _returned(necessary, (hfn, node, var, pattern, padded, ret), "no caller in the files uses it")
                continue
            bad = next((u for _, _, u in uses if u.kind in ("accumulate", "read", "partial")), None)
            lost = next(((c, n, u) for c, n, u in uses if u.kind not in ("write", "accumulate", "read", "partial")), None)
            if bad is not None:
                necessary.append({"file": hfn.file, "line": node.lineno, "function": hfn.qualname, "variable": var,
                                  "pattern": pattern, "why": f"a caller of {name}(): {bad.kind}: {bad.how}"})
            elif lost is not None:
                c, n, u = lost
                use = _Use("escape", n.lineno, f"returned by helper {name}() to {c.qualname} ({c.file}:{n.lineno}): "
                                               f"{u.kind}: {u.how}", "low")
                _emit(project, findings, Finding(hfn.file, node.lineno, hfn.qualname, var, "trail-lost", pattern,
                                                 _short(use.how, 400), "low", [f"the trail is lost in a caller: {use.how}"],
                                                 _site_obligation("trail-lost", var, pattern, use, padded),
                                                 bool(padded), False, False, _src(node)), node)
            else:
                _helper_finding(project, findings, name, hfn, node, var, pattern, padded, ret, uses)


def _returned(necessary, site, why):
    hfn, node, var, pattern, _, _ = site
    necessary.append({"file": hfn.file, "line": node.lineno, "function": hfn.qualname, "variable": var,
                      "pattern": pattern, "why": f"return: the zeros are what its callers receive ({why})"})


def _helper_finding(project, findings, name, hfn, node, var, pattern, padded, ret, uses):
    conf = "low" if any(u.confidence == "low" for _, _, u in uses) else "medium"
    how = "; ".join(f"caller {c.qualname} ({c.file}:{n.lineno}): {u.how}" for c, n, u in uses[:3])
    use = uses[0][2]
    use.view = use.view or ret.view
    _emit(project, findings, Finding(hfn.file, node.lineno, hfn.qualname, var, "zero-fill-then-overwrite", pattern,
                                     _short(f"returned by helper {name}(); {how}", 400), conf,
                                     [f"allocation helper: all {len(uses)} caller(s) in the files overwrite it",
                                      "callers outside the files given are not seen"],
                                     _site_obligation("zero-fill-then-overwrite", var, pattern, use, padded)
                                     + f"; and every caller of {name}() must do so", bool(padded), use.view,
                                     bool(use.partial_writes), _src(node)), node)
