"""The analysis of the static audit (:mod:`workbook.audit`), and the rules it follows.

``python -m workbook audit PATH...`` (or ``python -m workbook.audit PATH...``) reads Python sources with
:mod:`ast` and lists **allocate-then-overwrite candidates**: a zero fill (``torch.zeros``,
``zeros_like``, ``new_zeros``, ``full(.., 0)``, ``full_like(.., 0)``, ``new_full(.., 0)``,
``.zero_()``, ``.fill_(0)``, ``t[:] = 0``) whose tensor is, as its next use, overwritten:

* passed to a Triton launch ``kernel[grid](...)`` whose kernel (found in the files given) only *stores*
  through that pointer (a kernel that loads or ``atomic_*``s it accumulates: the zeros are needed);
* passed as ``out=`` to a call, or as the output parameter of a custom op (``mutates_args`` of a
  ``torch.library.custom_op`` in the files, or an output-named argument of ``torch.ops.*`` / ``ops.*``);
* assigned whole: ``x[:] = ...``, ``x[...] = ...``, ``x.copy_(...)``, or by complementary slices
  ``x[:k] = a; x[k:] = b``;
* handed to a Python function of the files given whose parameter is written that way (followed up to
  a few calls deep), or returned from an allocation helper whose callers do one of the above.

A zeros buffer whose next use reads it (``+=``, ``index_add_``, ``scatter_add_``, an accumulating
kernel, any arithmetic, a partial slice write that leaves the rest zero) is **not** reported: there the
zero fill is part of the result.

It also flags the reverse risk: an ``empty`` buffer written only through slices (``out[:n] = ...``,
``kernel[grid](out[:n])``) that are not provably the whole length, and then used.

Confidence (the rule, so that a maintainer can weigh a finding):

* ``high``: the overwrite is the first use after the fill, in the same or an enclosing block (not only
  under an ``if``/loop/``try`` the fill is not under), and it is a whole-tensor construct
  (``x[:] =``, ``copy_``, ``out=``) or a launch/custom op/function whose body in the files given
  writes that argument and never reads it.
* ``medium``: the same, but the overwrite is conditional, goes through an allocation helper's
  callers, is done by a kernel whose stores depend on values it loads (indices, lengths) or that
  returns early, or the callee is not in the files (a kernel or op whose argument has an output-like
  name such as ``out``/``output``/``*_out``); reverse-risk (partial ``empty``) findings.
* ``low``: the callee is not in the files and nothing says the argument is an output.

Writes through part of a tensor (``x[:n]``, ``narrow``, ``select``, an alias ``y = x[:n]``) are partial;
``if``/``else`` branches are exclusive; other control flow is read in source order. Only the functions
that hold a fill or an ``empty`` (and those the analysis follows) are parsed, one def at a time, which
keeps a tree of thousands of files to seconds of CPU; a file whose def does not parse is parsed whole
and, if that fails, named in the output and skipped.

A finding is a *candidate*, not a proof: its **proof obligation** says which writes must cover which
region (and whether padding, a view over larger storage or a partial slice is involved); prove it
with :mod:`workbook.coverage` (poisoned runs, whole-storage coverage maps, the consumer differential,
``find_redundant_zero_fills``), as notebook 07 does.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from .results import _RANK
from .source import (_call_name, _control, _dotted, _exclusive, _Func, _Index, _is_whole_slice, _is_zero,
                     _mutated_args, _params, _Source, _src, _stmt_of)

# ---- vocabularies ---------------------------------------------------------------------------------
_META = {"shape", "size", "stride", "dtype", "device", "numel", "dim", "ndim", "data_ptr", "is_contiguous",
         "element_size", "storage_offset", "nbytes", "itemsize", "is_cuda", "layout", "requires_grad",
         "untyped_storage", "get_device", "nelement", "ndimension", "is_floating_point"}
_VIEWS = {"view", "reshape", "T", "mT", "t", "transpose", "permute", "as_strided", "narrow", "flatten", "unflatten",
          "unsqueeze", "squeeze", "view_as", "reshape_as", "expand", "select", "unbind", "split", "chunk",
          "movedim", "swapaxes", "diagonal", "real", "imag", "data", "detach"}
_PART_VIEWS = {"narrow", "select", "split", "chunk", "unbind", "diagonal"}   # views of a part of the tensor
_ACCUM = {"add_", "sub_", "mul_", "div_", "index_add_", "scatter_add_", "scatter_reduce_", "index_reduce_",
          "addmm_", "addmv_", "addcmul_", "addcdiv_", "baddbmm_", "addbmm_", "lerp_", "clamp_", "clamp_min_",
          "clamp_max_", "neg_", "abs_", "exp_", "pow_", "sqrt_", "relu_", "masked_scatter_", "logical_or_",
          "bitwise_or_", "bitwise_and_", "maximum_", "max_", "min_", "copysign_", "floor_divide_", "fmod_",
          "__iadd__", "__isub__"}
_PARTIAL = {"masked_fill_", "index_fill_", "index_copy_", "scatter_", "index_put_", "put_", "fill_diagonal_",
            "tril_", "triu_"}
_WHOLE = {"copy_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_", "geometric_", "cauchy_",
          "log_normal_"}
_READ_ONLY_CALLS = {"print", "len", "isinstance", "id", "hash", "repr", "str", "type"}
_OUTPUT_NAME = re.compile(r"(^|_)(out|outs|output|outputs|dst|dest|result|results|res|o|y|c)(_|\d|$)|out$|^out",
                          re.IGNORECASE)
_MAX_DEPTH = 4


# ---- use analysis ---------------------------------------------------------------------------------

@dataclass
class _Use:
    """The decisive use of a buffer after its fill."""

    kind: str          # 'write' | 'accumulate' | 'read' | 'partial' | 'return' | 'escape' | 'none'
    line: int
    how: str
    confidence: str = "high"
    view: bool = False
    partial_writes: list = field(default_factory=list)
    return_index: int | None = None
    conditional: bool = False
    in_loop: bool = False
    file: str = ""


def _min_conf(a: str, b: str) -> str:
    return a if _RANK[a] <= _RANK[b] else b


def _tainted(body: list, param: str) -> set[str]:
    """``param`` and the local names computed from it (pointer arithmetic, block pointers), in a
    kernel's nodes ``body``."""
    taint = {param}
    for _ in range(3):  # propagate through local pointer arithmetic / block pointers
        for n in body:
            if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and n.value is not None:
                names = {x.id for x in ast.walk(n.value) if isinstance(x, ast.Name)}
                if names & taint:
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    for t in targets:
                        taint |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
    return taint


def _loaded_names(body: list) -> set[str]:
    """The local names of a kernel that hold values read from memory (``tl.load``), or computed from them."""
    loaded: set[str] = set()
    for _ in range(3):
        for n in body:
            if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and n.value is not None:
                has_load = any(isinstance(x, ast.Call) and _call_name(x) == "load" for x in ast.walk(n.value))
                names = {x.id for x in ast.walk(n.value) if isinstance(x, ast.Name)}
                if has_load or names & loaded:
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    for t in targets:
                        loaded |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
    return loaded


# ---- the project: the index, plus what the analysis learns about its functions -------------------

class _Project(_Index):
    """The files given (:class:`~workbook.audit.source._Index`), with two cached summaries: how a Triton
    kernel uses a pointer parameter (:meth:`kernel_use`) and what a Python function does first with a
    parameter (:meth:`param_use`)."""

    def __init__(self, sources: dict[str, _Source], skipped: list):
        super().__init__(sources, skipped)
        self._kernel_summary: dict[tuple[int, str], str] = {}
        self._bodies: dict[int, list] = {}
        self._param_summary: dict[tuple[int, str], tuple] = {}

    # -- Triton kernels: how does a kernel use the pointer it gets in parameter p?
    def kernel_use(self, fn: _Func, param: str, depth: int = 0) -> str:
        """'store' (only stored through), 'store-dd' (only stored, but where depends on loaded values or
        an early return), 'load', 'rmw' (loaded and stored, or atomics), 'none'."""
        key = (id(fn.node), param)
        if key in self._kernel_summary:
            return self._kernel_summary[key]
        self._kernel_summary[key] = "none"
        body = self._bodies.get(id(fn.node))
        if body is None:
            body = self._bodies[id(fn.node)] = list(ast.walk(fn.node))
        taint = _tainted(body, param)
        # values read from memory (indices, lengths): stores that depend on them cover a data-dependent set
        loaded = _loaded_names(body)
        early_return = any(isinstance(n, ast.Return) for n in body)
        data_dep = False
        stores = loads = atomics = False
        for n in body:
            if not isinstance(n, ast.Call):
                continue
            name = _call_name(n)
            ptr = None
            if name in ("store", "load") or name.startswith("atomic_"):
                if isinstance(n.func, ast.Attribute) and _dotted(n.func.value) not in ("tl", "triton.language"):
                    ptr = n.func.value   # desc.store(...), block_ptr style methods
                else:
                    ptr = n.args[0] if n.args else next((k.value for k in n.keywords if k.arg in ("pointer", "ptr")), None)
            if ptr is not None:
                if {x.id for x in ast.walk(ptr) if isinstance(x, ast.Name)} & taint:
                    if name == "store":
                        stores = True
                        mask = next((k.value for k in n.keywords if k.arg == "mask"), n.args[2] if len(n.args) > 2 else None)
                        used = {x.id for e in (ptr, mask) if e is not None for x in ast.walk(e) if isinstance(x, ast.Name)}
                        loop = fn.parents.get(n)
                        while loop is not None and loop is not fn.node:
                            if isinstance(loop, (ast.For, ast.While)):
                                used |= {x.id for x in ast.walk(getattr(loop, "iter", None) or loop.test)
                                         if isinstance(x, ast.Name)}
                            loop = fn.parents.get(loop)
                        data_dep |= bool(used & loaded)
                    elif name == "load":
                        loads = True
                    else:
                        atomics = True
                continue
            hits = [i for i, a in enumerate(n.args) if {x.id for x in ast.walk(a) if isinstance(x, ast.Name)} & taint]
            callee = self.resolve(name) if hits and depth < _MAX_DEPTH else None
            if callee is not None:   # a @triton.jit helper called with our pointer
                callee = [callee]
                params = _params(callee[0].node)
                for i, a in enumerate(n.args):
                    if i < len(params) and {x.id for x in ast.walk(a) if isinstance(x, ast.Name)} & taint:
                        u = self.kernel_use(callee[0], params[i], depth + 1)
                        stores |= u in ("store", "store-dd", "rmw")
                        loads |= u in ("load", "rmw")
                        data_dep |= u == "store-dd"
        res = "rmw" if atomics or (stores and loads) else "store" if stores else "load" if loads else "none"
        if res == "store" and (data_dep or early_return):
            res = "store-dd"
        self._kernel_summary[key] = res
        return res

    # -- Python functions: what does fn do first with its parameter p?
    def param_use(self, fn: _Func, param: str, depth: int) -> "_Use":
        key = (id(fn.node), param)
        if key in self._param_summary:
            return self._param_summary[key]
        self._param_summary[key] = _Use("escape", fn.node.lineno, f"{fn.qualname} (recursive)", "low")
        mutated = _mutated_args(fn.node)
        use = _Analyzer(self, fn, depth + 1).first_use(param, start=None, origin_node=None)
        if mutated is not None and param in mutated and use.kind in ("escape", "none"):
            use = _Use("write", fn.node.lineno, f"custom op {fn.qualname} (mutates_args={param!r})", "high")
        self._param_summary[key] = use
        return use


class _Analyzer:
    """Follows one buffer (a Name or dotted attribute) through a function body in source order."""

    def __init__(self, project: _Project, fn: _Func, depth: int = 0):
        self.p, self.fn, self.depth = project, fn, depth
        self.parents = fn.parents

    def _occurrences(self, keys: set[str]):
        out = []
        for k in keys:
            out.extend(self.fn.names.get(k, ()))
        return out

    def first_use(self, key: str, start: ast.AST | None, origin_node: ast.AST | None) -> _Use:
        """The first decisive use of ``key`` after statement ``start`` (None: the function start)."""
        keys = {key}
        origin_ctrl = _control(start, self.parents) if start is not None else []
        partials: list[tuple[ast.AST, str]] = []
        sliced: set[str] = set()   # aliases that are views of a part of the buffer
        view_seen = False
        by_stmt, order = self._statements_after(keys, start)
        i = 0
        while i < len(order):
            st = order[i]
            i += 1
            roles = self._roles(by_stmt[id(st)], key, sliced)
            if not roles:
                continue
            # an alias (y = x.view(...), or x = x.view(...)) keeps following the same storage
            aliases = [r for r in roles if r.kind == "alias"]
            for r in aliases:
                view_seen = view_seen or r.view
                if r.partial_writes:
                    sliced.add(r.how)
                if r.how not in keys:
                    keys.add(r.how)
                    self._queue_alias(r.how, st, order, i, by_stmt)
            roles = [r for r in roles if r.kind != "alias"]
            if not roles:
                continue
            rank = {"accumulate": 0, "read": 1, "escape": 2, "return": 3, "partial": 4, "write": 5, "rebind": 6}
            roles.sort(key=lambda r: rank.get(r.kind, 9))
            r = roles[0]
            ctrl = _control(st, self.parents)
            conditional = len(ctrl) > len(origin_ctrl) or any(a is not b for a, b in zip(ctrl, origin_ctrl))
            r.conditional = conditional
            r.in_loop = any(isinstance(c, (ast.For, ast.AsyncFor, ast.While)) for c in ctrl if c not in origin_ctrl)
            r.view = r.view or view_seen
            if r.kind == "rebind":
                return _Use("none", st.lineno, "the name is rebound before any use", "low")
            if r.kind == "partial":
                partials.append((st, r))
                if _complementary([p[1] for p in partials]):
                    r2 = _Use("write", st.lineno, "complementary slices " + " and ".join(p[1].how for p in partials),
                              partials[0][1].confidence, view=r.view, partial_writes=[p[1].how for p in partials],
                              conditional=conditional or any(p[1].conditional for p in partials))
                    return r2
                continue
            if partials:
                return _Use("partial", partials[0][0].lineno, ", ".join(p[1].how for p in partials),
                        partial_writes=[p[1].how for p in partials], view=view_seen,
                        conditional=partials[0][1].conditional, in_loop=any(p[1].in_loop for p in partials))
            return r
        if partials:
            return _Use("partial", partials[0][0].lineno, ", ".join(p[1].how for p in partials),
                        partial_writes=[p[1].how for p in partials], view=view_seen,
                        in_loop=any(p[1].in_loop for p in partials))
        return _Use("none", 0, "no later use in this function", "low")

    def _statements_after(self, keys: set[str], start: ast.AST | None) -> tuple[dict[int, list], list]:
        """The statements after ``start`` that use the buffer, in source order, and the buffer's
        occurrences in each (``{id(statement): [nodes]}``); the other branch of an if/else is left out."""
        start_pos = (start.end_lineno, start.end_col_offset) if start is not None else (0, 0)
        occ = sorted(self._occurrences(keys), key=lambda n: (n.lineno, n.col_offset))
        by_stmt: dict[int, list] = {}
        order = []
        for n in occ:
            if (n.lineno, n.col_offset) < start_pos:
                continue
            st = _stmt_of(n, self.parents)
            if start is not None and _exclusive(start, st, self.parents):
                continue   # the other branch of an if/else: never runs after the fill
            if id(st) not in by_stmt:
                by_stmt[id(st)] = []
                order.append(st)
            by_stmt[id(st)].append(n)
        return by_stmt, order

    def _queue_alias(self, alias: str, after: ast.AST, order: list, i: int, by_stmt: dict[int, list]) -> None:
        """Add the statements after ``after`` that use ``alias`` (a new name of the buffer) to those still
        to visit, ``order[i:]``, which stays in source order (``order`` and ``by_stmt`` change in place)."""
        for n in self._occurrences({alias}):
            if (n.lineno, n.col_offset) > (after.end_lineno, after.end_col_offset):
                s2 = _stmt_of(n, self.parents)
                if id(s2) not in by_stmt:
                    by_stmt[id(s2)] = []
                    order.append(s2)
                by_stmt[id(s2)].append(n)
        order[i:] = sorted(order[i:], key=lambda s: (s.lineno, s.col_offset))
        for s2 in order[i:]:
            by_stmt[id(s2)].sort(key=lambda n: (n.lineno, n.col_offset))

    def _roles(self, nodes: list, key: str, sliced: set[str]) -> list[_Use]:
        """The roles of the buffer's occurrences ``nodes`` in one statement (metadata reads left out);
        a write through an alias of a slice is a partial write."""
        roles = []
        for n in nodes:
            r0 = self._role(n, key)
            if _dotted(n) in sliced and r0.kind == "write":   # written through an alias of a slice
                r0 = _Use("partial", r0.line, f"{r0.how} (through {_dotted(n)}, a slice of {key})", "medium",
                          view=True)
            roles.append(r0)
        return [r for r in roles if r.kind != "meta"]

    # -- the role of one occurrence of the buffer
    def _role(self, node, key) -> _Use:
        par = self.parents.get(node)
        line = node.lineno
        # x.attr / x.method(...)
        if isinstance(par, ast.Attribute) and par.value is node:
            attr = par.attr
            gp = self.parents.get(par)
            if attr in _META:
                return _Use("meta", line, attr)
            if isinstance(gp, ast.Call) and gp.func is par:
                if attr in ("zero_",) or (attr == "fill_" and gp.args and _is_zero(gp.args[0])):
                    return _Use("meta", line, "refill")    # another zero fill: the new fill is its own site
                if attr in _WHOLE:
                    if any(_dotted(n) == key for a in gp.args for n in ast.walk(a)):
                        return _Use("accumulate", line, f"{key}.{attr}(...{key}...)")
                    return _Use("write", line, f"{key}.{attr}(...)", "high")
                if attr == "fill_":
                    return _Use("write", line, f"{key}.fill_(...)", "high")
                if attr in _ACCUM:
                    return _Use("accumulate", line, f"{key}.{attr}(...)")
                if attr == "index_put_" and any(k.arg == "accumulate" for k in gp.keywords):
                    return _Use("accumulate", line, f"{key}.index_put_(..., accumulate=...)")
                if attr in _PARTIAL:
                    return _Use("partial", line, f"{key}.{attr}(...)", "medium")
                if attr in _VIEWS:
                    return self._role_of_view(gp, key, line, partial=attr in _PART_VIEWS)
                return _Use("read", line, f"{key}.{attr}(...)")
            if attr in _VIEWS:
                return self._role_of_view(par, key, line, partial=False)
            return _Use("read", line, f"{key}.{attr}")
        # x[...]
        if isinstance(par, ast.Subscript) and par.value is node:
            whole = _is_whole_slice(par.slice)
            gp = self.parents.get(par)
            if isinstance(par.ctx, ast.Store):
                stmt = _stmt_of(par, self.parents)
                if isinstance(stmt, ast.AugAssign):
                    return _Use("accumulate", line, f"{_src(par)} {_src_op(stmt.op)}= ...")
                value = getattr(stmt, "value", None)
                if value is not None and any(_dotted(n) == key for n in ast.walk(value)):
                    return _Use("accumulate", line, f"{_src(par)} = ... {key} ...")
                if value is not None and _is_zero(value):
                    return _Use("meta", line, "refill")
                if whole:
                    return _Use("write", line, f"{_src(par)} = ...", "high")
                return _Use("partial", line, f"{_src(par)} = ...", "medium")
            return self._role_of_view(par, key, line, partial=not whole)
        return self._role_of_value(node, key, line, view=False, partial=False)

    def _role_of_view(self, expr, key, line, partial: bool) -> _Use:
        u = self._role_of_value(expr, key, line, view=True, partial=partial)
        return u

    def _role_of_value(self, expr, key, line, view: bool, partial: bool) -> _Use:
        """The role of an expression that *is* the buffer (or a view of it)."""
        par = self.parents.get(expr)
        # a further view/method on the view
        if isinstance(par, ast.Attribute) and par.value is expr:
            gp = self.parents.get(par)
            if par.attr in _META:
                return _Use("meta", line, par.attr)
            if par.attr in _VIEWS:
                return self._role_of_value(gp if isinstance(gp, ast.Call) and gp.func is par else par, key, line, True,
                                           partial or par.attr in _PART_VIEWS)
            if isinstance(gp, ast.Call) and gp.func is par:
                if par.attr in _WHOLE or par.attr == "fill_":
                    return _Use("partial" if partial else "write", line, f"{_src(expr)}.{par.attr}(...)",
                                "medium" if partial else "high", view=view)
                if par.attr in _ACCUM:
                    return _Use("accumulate", line, f"{_src(expr)}.{par.attr}(...)")
                if par.attr in _PARTIAL:
                    return _Use("partial", line, f"{_src(expr)}.{par.attr}(...)", "medium", view=view)
            return _Use("read", line, _src(par))
        if isinstance(par, ast.Subscript) and par.value is expr:
            if isinstance(par.ctx, ast.Store):
                stmt = _stmt_of(par, self.parents)
                if isinstance(stmt, ast.AugAssign):
                    return _Use("accumulate", line, f"{_src(par)} += ...")
                whole = _is_whole_slice(par.slice) and not partial
                return _Use("write" if whole else "partial", line, f"{_src(par)} = ...", "high" if whole else "medium", view=True)
            return self._role_of_value(par, key, line, True, partial or not _is_whole_slice(par.slice))
        if isinstance(par, ast.Call) and expr is not par.func:
            return self._role_in_call(par, expr, key, line, view, partial)
        if isinstance(par, ast.keyword):
            call = self.parents.get(par)
            if isinstance(call, ast.Call):
                return self._role_in_call(call, expr, key, line, view, partial, kw=par.arg)
        if isinstance(par, ast.Starred):
            return _Use("escape", line, f"*{key} in {_src(self.parents.get(par))}", "low")
        if isinstance(par, (ast.Assign, ast.AnnAssign)) and par.value is expr:
            targets = par.targets if isinstance(par, ast.Assign) else [par.target]
            if len(targets) == 1 and _dotted(targets[0]) is not None:
                return _Use("alias", line, _dotted(targets[0]), view=view, partial_writes=["sliced"] if partial else [])
            return _Use("escape", line, f"stored: {_src(par)}", "low")
        if isinstance(par, ast.Return):
            return _Use("return", line, f"return {_src(expr)}", view=view, partial_writes=[] if not partial else ["sliced"])
        if isinstance(par, ast.Tuple) and isinstance(self.parents.get(par), ast.Return):
            return _Use("return", line, f"return {_src(par)}", view=view, return_index=par.elts.index(expr))
        if isinstance(par, (ast.Assign,)) and expr in getattr(par, "targets", []):
            return _Use("rebind", line, "rebound")
        if isinstance(expr, ast.Name) and isinstance(expr.ctx, ast.Store):
            stmt = _stmt_of(expr, self.parents)
            if isinstance(stmt, ast.AugAssign):
                return _Use("accumulate", line, f"{key} {_src_op(stmt.op)}= ...")
            if isinstance(stmt, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)) or isinstance(par, ast.Tuple):
                return _Use("rebind", line, "rebound")
            return _Use("rebind", line, "rebound")
        if isinstance(expr, ast.Attribute) and isinstance(expr.ctx, ast.Store):
            stmt = _stmt_of(expr, self.parents)
            if isinstance(stmt, ast.AugAssign):
                return _Use("accumulate", line, f"{key} {_src_op(stmt.op)}= ...")
            return _Use("rebind", line, "rebound")
        if isinstance(par, (ast.Tuple, ast.List, ast.Dict, ast.Set, ast.Yield, ast.YieldFrom)):
            return _Use("escape", line, f"placed in {_src(par)}", "low")
        return _Use("read", line, _src(par) if par is not None else key)

    def _role_in_call(self, call: ast.Call, arg, key, line, view, partial, kw: str | None = None) -> _Use:
        """The role of the buffer (or a view of it), ``arg``, passed to ``call`` (as keyword ``kw``)."""
        name = _call_name(call)
        desc = _src(call.func)
        if isinstance(call.func, ast.Subscript):            # kernel[grid](...): a Triton launch
            return self._role_in_launch(call, arg, key, line, view, partial, kw, name)
        if kw == "out":
            return _Use("partial" if partial else "write", line, f"{desc}(..., {kw}={_src(arg)})",
                        "medium" if partial else "high", view=view)
        if name in _READ_ONLY_CALLS:
            return _Use("meta", line, name)
        # a Python function (or custom op) defined in the files given
        u = self._role_in_function(call, arg, line, view, partial, kw, name, desc)
        if u is not None:
            return u
        dotted = _dotted(call.func) or ""
        if dotted.startswith("torch.ops.") or dotted.startswith("ops.") or "._C." in dotted or dotted.startswith("_C") \
                or "custom_ops" in dotted:
            argname = kw or (_dotted(arg) or key)
            first = call.args and call.args[0] is arg
            outish = bool(_OUTPUT_NAME.search(argname.rsplit(".", 1)[-1]))
            if outish or first:
                return _Use("partial" if partial else "write", line,
                            f"custom op {dotted}(...) (not in the files: '{argname}' assumed to be its output)",
                            "medium" if outish and not partial else "low", view=view)
        if kw and _OUTPUT_NAME.search(kw):
            return _Use("partial" if partial else "write", line,
                        f"{desc}(..., {kw}={_src(arg)}) (callee not in the files: '{kw}' assumed to be an output)",
                        "low" if partial else "medium", view=view)
        if dotted.startswith(("torch.", "F.", "tl.", "np.", "math.")) or dotted in ("torch",):
            return _Use("read", line, f"{desc}(...)")
        return _Use("escape", line, f"passed to {desc}(...)", "low")

    def _role_in_launch(self, call: ast.Call, arg, key, line, view, partial, kw, name) -> _Use:
        """``kernel[grid](..., arg, ...)``: what the kernel (if it is in the files) does with that pointer."""
        desc = f"{_dotted(call.func.value) or name}[grid]"
        kern = self.p.resolve(name)
        param = kw if kw is not None else None
        if kern is not None and param is None:
            params = _params(kern.node)
            idx = call.args.index(arg) if arg in call.args else -1
            param = params[idx] if 0 <= idx < len(params) else None
        if kern is not None and param is not None:
            u = self.p.kernel_use(kern, param)
            where = f"{kern.file}:{kern.node.lineno}"
            if u in ("store", "store-dd"):
                dd = u == "store-dd"
                return _Use("partial" if partial else "write", line,
                            f"Triton launch {desc}(...) writes param '{param}' ({where}: stores only"
                            + ("; WHICH elements depends on loaded values or an early return" if dd else "") + ")",
                            "medium" if partial or dd else "high", view=view)
            if u == "rmw":
                return _Use("accumulate", line, f"Triton launch {name}: param '{param}' is loaded and stored / atomics ({where})")
            if u == "load":
                return _Use("read", line, f"Triton launch {name}: param '{param}' is only loaded ({where})")
            return _Use("escape", line, f"Triton launch {name}: param '{param}' unused", "low")
        argname = kw or (_dotted(arg) or key)
        conf = "medium" if _OUTPUT_NAME.search(argname.rsplit(".", 1)[-1]) or _OUTPUT_NAME.search(key.rsplit(".", 1)[-1]) else "low"
        return _Use("partial" if partial else "write", line,
                    f"Triton launch {desc}(...) (kernel not in the files: assumed to write '{argname}')",
                    "low" if partial else conf, view=view)

    def _role_in_function(self, call: ast.Call, arg, line, view, partial, kw, name, desc) -> _Use | None:
        """A call of a Python function (or custom op) of the files given: what it does first with the
        parameter that receives ``arg`` (followed up to ``_MAX_DEPTH`` calls deep); None when the callee
        is not there (or not followed) or no parameter receives it."""
        fn = self.p.resolve(name)
        if fn is None or self.depth >= _MAX_DEPTH or fn.node is self.fn.node:
            return None
        params = _params(fn.node)
        skip = 1 if params and params[0] in ("self", "cls") and (fn.is_method or isinstance(call.func, ast.Attribute)) else 0
        param = kw
        if param is None and arg in call.args:
            idx = call.args.index(arg) + skip
            param = params[idx] if idx < len(params) else None
        if param is None or param not in params:
            return None
        u = self.p.param_use(fn, param, self.depth)
        where = f"{fn.file}:{u.line or fn.node.lineno}"
        if u.kind == "write":
            return _Use("partial" if partial else "write", line,
                        f"{desc}(...) -> {u.how} [{where}]", _min_conf(u.confidence, "medium" if partial else "high"),
                        view=view or u.view)
        if u.kind in ("accumulate", "read"):
            return _Use(u.kind, line, f"{desc}(...) -> {u.how} [{where}]")
        if u.kind == "partial":
            return _Use("partial", line, f"{desc}(...) -> {u.how} [{where}]", "medium", view=True)
        return _Use("escape", line, f"{desc}(...) [{where}]: {u.how}", "low")


def _src_op(op) -> str:
    return {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.BitOr: "|", ast.BitAnd: "&"}.get(type(op), "?")


def _slice_bounds(how: str) -> tuple[str, str] | None:
    m = re.match(r"^[\w.]+\[(.*?):(.*?)\]", how)
    if m and "," not in m.group(0):
        return m.group(1).strip(), m.group(2).strip()
    return None


def _complementary(uses: list[_Use]) -> bool:
    """x[:k] = a and x[k:] = b (in either order): together the whole first dimension."""
    b = [_slice_bounds(u.how) for u in uses]
    lows = {hi for lo, hi in (x for x in b if x) if lo == ""}
    return any(x and x[1] == "" and x[0] in lows for x in b)
