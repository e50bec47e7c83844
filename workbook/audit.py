"""Static audit: where does a codebase zero-fill a buffer that is then overwritten?

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

import argparse
import ast
import fnmatch
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

__all__ = [
    "CONFIDENCES", "Finding", "Skipped", "AuditResult", "audit", "audit_sources", "format_text", "to_json",
    "add_arguments", "run", "main",
    "SAMPLE_VERDICTS", "check_verdicts", "mixed_batch_reference", "check_mixed_batch_writer",
]

CONFIDENCES = ("low", "medium", "high")
_RANK = {c: i for i, c in enumerate(CONFIDENCES)}

# ---- vocabularies ---------------------------------------------------------------------------------
_ZERO_CTORS = {"zeros", "zeros_like", "new_zeros"}
_FULL_CTORS = {"full": 1, "full_like": 1, "new_full": 1}        # index of the fill value (after the receiver)
_EMPTY_CTORS = {"empty", "empty_like", "new_empty", "empty_strided"}
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
_PAD_NAME = re.compile(r"round_up|roundup|cdiv|ceil|align|pad|next_power_of_2|next_multiple|multiple_of",
                       re.IGNORECASE)
_MAX_DEPTH = 4


# ---- results --------------------------------------------------------------------------------------

@dataclass
class Finding:
    """One candidate. ``kind`` is 'zero-fill-then-overwrite' or 'empty-partial-write'."""

    file: str
    line: int
    function: str
    variable: str
    kind: str
    pattern: str                 # the fill (or empty allocation) as written, e.g. "torch.zeros(...)"
    overwrite: str               # what overwrites it (or the partial writes), with its file:line
    confidence: str
    reasons: list[str]
    obligation: str
    padding: bool = False
    view: bool = False
    partial: bool = False
    code: str = ""               # the statement as written

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class Skipped:
    file: str
    error: str


@dataclass
class AuditResult:
    findings: list[Finding]
    skipped: list[Skipped]
    files: int
    seconds: float
    necessary: list[dict] = field(default_factory=list)   # zero fills kept on purpose, with the reason

    def at_least(self, confidence: str) -> list[Finding]:
        return [f for f in self.findings if _RANK[f.confidence] >= _RANK[confidence]]

    def counts(self) -> dict[str, int]:
        return {c: sum(f.confidence == c for f in self.findings) for c in CONFIDENCES}

    def report(self, min_confidence: str = "low") -> str:
        return format_text(self, min_confidence)

    __str__ = report
    _repr_pretty_ = lambda self, p, cycle: p.text(self.report())  # noqa: E731


# ---- small AST helpers ----------------------------------------------------------------------------

def _dotted(node) -> str | None:
    """'a.b.c' for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _call_name(call: ast.Call) -> str:
    """Last name of what is called: torch.zeros -> 'zeros', x.new_zeros -> 'new_zeros', k[g] -> 'k'."""
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Subscript):
        d = _dotted(f.value)
        return d.rsplit(".", 1)[-1] if d else ""
    return ""


def _is_zero(node) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value == 0
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _is_zero(node.operand)
    return False


def _is_whole_slice(sl) -> bool:
    """x[:], x[...], x[:, :], x[..., :]"""
    if isinstance(sl, ast.Constant) and sl.value is Ellipsis:
        return True
    if isinstance(sl, ast.Slice):
        return sl.lower is None and sl.upper is None and sl.step is None
    if isinstance(sl, ast.Tuple):
        return all(_is_whole_slice(e) for e in sl.elts)
    return False


def _src(node) -> str:
    try:
        s = ast.unparse(node)
    except Exception:  # pragma: no cover - very old or odd nodes
        return "<expr>"
    return s if len(s) <= 90 else s[:87] + "..."


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


def _control(node, parents) -> list[ast.AST]:
    """The if/loop/try/match statements enclosing node (innermost last), up to the function."""
    out = []
    n = parents.get(node)
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module, ast.Lambda)):
        if isinstance(n, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.IfExp)) or type(n).__name__ in ("Match", "TryStar"):
            out.append(n)
        n = parents.get(n)
    return list(reversed(out))


def _branch_path(node, parents) -> dict[int, str]:
    out, child, n = {}, node, parents.get(node)
    while n is not None:
        if isinstance(n, ast.If):
            out[id(n)] = "body" if any(child is c for c in n.body) else "orelse" if any(child is c for c in n.orelse) else "test"
        child, n = n, parents.get(n)
    return out


def _exclusive(a, b, parents) -> bool:
    """Are statements a and b in different branches of one if/else?"""
    pa, pb = _branch_path(a, parents), _branch_path(b, parents)
    return any(k in pb and pb[k] != v and "test" not in (v, pb[k]) for k, v in pa.items())


def _stmt_of(node, parents):
    while node is not None and not isinstance(node, ast.stmt):
        node = parents.get(node)
    return node


def _is_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = _dotted(target) or ""
        if name.endswith("jit") or name.endswith(".jit") or name in ("triton.autotune", "autotune", "libentry"):
            if "jit" in name or any("jit" in (_dotted(x.func if isinstance(x, ast.Call) else x) or "") for x in fn.decorator_list):
                return True
    return False


def _mutated_args(fn: ast.FunctionDef) -> set[str] | None:
    """mutates_args of a torch.library.custom_op decorator, or None."""
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and (_dotted(d.func) or "").endswith("custom_op"):
            for k in d.keywords:
                if k.arg == "mutates_args" and isinstance(k.value, (ast.Tuple, ast.List, ast.Set)):
                    return {e.value for e in k.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            return set()
    return None


def _params(fn) -> list[str]:
    a = fn.args
    return [p.arg for p in list(getattr(a, "posonlyargs", [])) + list(a.args)] + [p.arg for p in a.kwonlyargs]


# ---- the project index ----------------------------------------------------------------------------

_DEF_RE = re.compile(r"^([ \t]*)(?:async[ \t]+)?def[ \t]+(\w+)", re.M)
_CAND_RE = re.compile(r"zeros|zero_\(|fill_\(|full(?:_like)?\(|\]\s*=\s*0\b|empty(?:_like|_strided)?\(")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


class _Source:
    """One file: its text, its lines, and where its functions start (a cheap index; nothing parsed yet)."""

    def __init__(self, name: str, text: str):
        self.name, self.text = name, text
        self.lines = text.splitlines()
        # line index (0-based) and indentation of every def, in order
        self.defs: list[tuple[int, int, str]] = []
        if "def" in text:
            for m in _DEF_RE.finditer(text):
                self.defs.append((m.start(), len(m.group(1).expandtabs()), m.group(2)))
            # offsets -> line numbers in one pass
            if self.defs:
                offs = [d[0] for d in self.defs]
                lines_at, line, pos = [], 0, 0
                for o in offs:
                    line += text.count("\n", pos, o)
                    pos = o
                    lines_at.append(line)
                self.defs = [(ln, ind, name) for ln, (_, ind, name) in zip(lines_at, self.defs)]
        self._ends: dict[int, int] = {}
        self.tree: ast.Module | None = None     # the whole file, parsed only when a segment fails
        self.broken: str | None = None

    def block_end(self, i: int, ind: int) -> int:
        """Index one past the last line of the def starting at line i (by indentation)."""
        if i not in self._ends:
            self._ends[i] = self._block_end(i, ind)
        return self._ends[i]

    def _block_end(self, i: int, ind: int) -> int:
        lines, n = self.lines, len(self.lines)
        j, depth = i, 0
        while j < n:  # the header may span lines: find its end by bracket balance
            code = lines[j].split("#", 1)[0]
            depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
            j += 1
            if depth <= 0 and code.rstrip().endswith(":"):
                break
            if depth <= 0 and ":" in code and not code.rstrip().endswith(("(", ",", "\\")):
                # one-line def (def f(): return 1)
                if code.rstrip()[-1:] != ":":
                    return j
        end = j
        while j < n:
            line = lines[j]
            s = line.strip()
            if s and not s.startswith("#"):
                if _indent(line.expandtabs()) <= ind:
                    break
                end = j + 1
            j += 1
        return end

    def deco_start(self, i: int, ind: int) -> int:
        k, start = i - 1, i
        while k >= 0 and i - k < 80:
            line = self.lines[k]
            s = line.strip()
            if not s:
                break
            li = _indent(line.expandtabs())
            if li == ind and s.startswith("@"):
                start = k
            elif li < ind or (li == ind and not s.startswith((")", "]", "}"))):
                break
            k -= 1
        return start

    def enclosing_def(self, line0: int):
        """The innermost def (line, indent, name) whose block holds 0-based line ``line0``."""
        best = None
        li = _indent(self.lines[line0].expandtabs()) if line0 < len(self.lines) else 0
        for d in self.defs:
            if d[0] > line0:
                break
            if d[1] < li or d[0] == line0:
                if d[0] == line0 or self.block_end(d[0], d[1]) > line0:
                    best = d
        return best


@dataclass
class _Func:
    file: str
    node: ast.FunctionDef
    qualname: str
    parents: dict
    is_method: bool
    names: dict = field(default_factory=dict)    # dotted name -> its Name/Attribute nodes in this body
    stmts: list = field(default_factory=list)    # Assign/AnnAssign/Expr statements of this body


def _index_def(root) -> tuple[dict, dict[int, tuple[list, dict]]]:
    """One pass over a def: parent links, and per (nested) def its statements and name occurrences."""
    parents: dict = {}
    owned: dict[int, tuple[list, dict]] = {id(root): ([], {})}
    stack = [(root, root)]
    stmt_types = (ast.Assign, ast.AnnAssign, ast.Expr, ast.Return)
    while stack:
        n, owner = stack.pop()
        for fname in n._fields:
            v = getattr(n, fname, None)
            if isinstance(v, ast.AST):
                children = (v,)
            elif isinstance(v, list):
                children = v
            else:
                continue
            for c in children:
                if not isinstance(c, ast.AST):
                    continue
                parents[c] = n
                o = owner
                if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    o = c
                    owned[id(c)] = ([], {})
                    owned.setdefault("defs", []).append((c, owner))
                elif isinstance(c, (ast.Lambda, ast.ClassDef)):
                    o = c
                    owned[id(c)] = ([], {})
                if isinstance(c, (ast.Name, ast.Attribute)):
                    d = _dotted(c)
                    if d is not None:
                        owned[id(owner)][1].setdefault(d, []).append(c)
                elif isinstance(c, stmt_types):
                    owned[id(owner)][0].append(c)
                stack.append((c, o))
    return parents, owned


class _Project:
    """Functions are parsed on demand, one def at a time (a file is parsed whole only if a def of it
    does not parse alone): a large tree is mostly text that holds no zero fill."""

    def __init__(self, sources: dict[str, _Source], skipped: list):
        self.sources = sources
        self.skipped = skipped
        self.index: dict[str, list[tuple[str, int, int]]] = {}
        for src in sources.values():
            for ln, ind, name in src.defs:
                self.index.setdefault(name, []).append((src.name, ln, ind))
        self.loaded: dict[tuple[str, int], list[_Func]] = {}
        self._kernel_summary: dict[tuple[int, str], str] = {}
        self._bodies: dict[int, list] = {}
        self._param_summary: dict[tuple[int, str], tuple] = {}
        self._resolved: dict[str, _Func | None] = {}

    def _qual_prefix(self, src: _Source, line0: int, ind: int) -> tuple[str, bool]:
        names, cur, is_method = [], ind, False
        for k in range(line0 - 1, -1, -1):
            if cur == 0:
                break
            line = src.lines[k]
            s = line.lstrip()
            if not s or s.startswith("#"):
                continue
            li = _indent(line.expandtabs())
            if li < cur:
                m = re.match(r"(?:async\s+)?(def|class)\s+(\w+)", s)
                if m:
                    if not names:
                        is_method = m.group(1) == "class"
                    names.append(m.group(2))
                    cur = li
                elif s.startswith(("if ", "else", "elif", "try", "except", "with ", "for ", "while ", "finally")):
                    cur = li
                else:
                    cur = li
        return ".".join(reversed(names)) + ("." if names else ""), is_method

    def load(self, file: str, line0: int, ind: int) -> list[_Func]:
        """Parse the def at 0-based ``line0`` of ``file``; returns its functions (nested ones too)."""
        key = (file, line0)
        if key in self.loaded:
            return self.loaded[key]
        src = self.sources[file]
        self.loaded[key] = []
        node = None
        if src.tree is None and src.broken is None:
            start, end = src.deco_start(line0, ind), src.block_end(line0, ind)
            text = "\n".join(src.lines[start:end])
            try:  # blank lines in front keep the file's line numbers
                mod = ast.parse(("\n" * (start - 1) + "if 1:\n" + text) if ind and start else ("\n" * start + text))
                body = mod.body[0].body if ind else mod.body
                node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                node = None
            if node is None:
                self._parse_whole(src)
        if node is None and src.tree is not None:
            node = next((n for n in ast.walk(src.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and n.lineno - 1 == line0), None)
        if node is None:
            return []
        parents, owned = _index_def(node)
        prefix, is_method = self._qual_prefix(src, line0, ind)
        funcs = []

        def collect(fnode, qual, method):
            stmts, names = owned.get(id(fnode), ([], {}))
            funcs.append(_Func(file, fnode, qual, parents, method, names, sorted(stmts, key=lambda n: n.lineno)))
            for st in [d for d, o in owned.get("defs", []) if o is fnode]:
                collect(st, qual + "." + st.name, False)

        collect(node, prefix + node.name, is_method)
        self.loaded[key] = funcs
        return funcs

    def _parse_whole(self, src: _Source):
        try:
            src.tree = ast.parse(src.text, filename=src.name)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            where = f" line {e.lineno}" if isinstance(e, SyntaxError) and e.lineno else ""
            src.broken = f"{type(e).__name__}{where}: {getattr(e, 'msg', None) or e}"
            self.skipped.append(Skipped(src.name, src.broken))

    def resolve(self, name: str) -> _Func | None:
        """The one function of that name in the files given (None if there is none or several)."""
        if name in self._resolved:
            return self._resolved[name]
        self._resolved[name] = None
        defs = self.index.get(name, [])
        if len(defs) == 1:
            f, ln, ind = defs[0]
            funcs = [x for x in self.load(f, ln, ind) if x.node.name == name]
            self._resolved[name] = funcs[0] if funcs else None
        return self._resolved[name]

    # -- Triton kernels: how does a kernel use the pointer it gets in parameter p?
    def kernel_use(self, fn: _Func, param: str, depth: int = 0) -> str:
        """'store' (only stored through), 'store-dd' (only stored, but where depends on loaded values or
        an early return), 'load', 'rmw' (loaded and stored, or atomics), 'none'."""
        key = (id(fn.node), param)
        if key in self._kernel_summary:
            return self._kernel_summary[key]
        self._kernel_summary[key] = "none"
        taint = {param}
        body = self._bodies.get(id(fn.node))
        if body is None:
            body = self._bodies[id(fn.node)] = list(ast.walk(fn.node))
        for _ in range(3):  # propagate through local pointer arithmetic / block pointers
            for n in body:
                if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and n.value is not None:
                    names = {x.id for x in ast.walk(n.value) if isinstance(x, ast.Name)}
                    if names & taint:
                        targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                        for t in targets:
                            taint |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
        # values read from memory (indices, lengths): stores that depend on them cover a data-dependent set
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
        start_pos = (start.end_lineno, start.end_col_offset) if start is not None else (0, 0)
        origin_ctrl = _control(start, self.parents) if start is not None else []
        partials: list[tuple[ast.AST, str]] = []
        sliced: set[str] = set()   # aliases that are views of a part of the buffer
        view_seen = False
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
        i = 0
        while i < len(order):
            st = order[i]
            i += 1
            roles = []
            for n in by_stmt[id(st)]:
                r0 = self._role(n, key)
                if _dotted(n) in sliced and r0.kind == "write":   # written through an alias of a slice
                    r0 = _Use("partial", r0.line, f"{r0.how} (through {_dotted(n)}, a slice of {key})", "medium",
                              view=True)
                roles.append(r0)
            roles = [r for r in roles if r.kind != "meta"]
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
                    for n in self._occurrences({r.how}):
                        if (n.lineno, n.col_offset) > (st.end_lineno, st.end_col_offset):
                            s2 = _stmt_of(n, self.parents)
                            if id(s2) not in by_stmt:
                                by_stmt[id(s2)] = []
                                order.append(s2)
                            by_stmt[id(s2)].append(n)
                    order[i:] = sorted(order[i:], key=lambda s: (s.lineno, s.col_offset))
                    for s2 in order[i:]:
                        by_stmt[id(s2)].sort(key=lambda n: (n.lineno, n.col_offset))
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
        name = _call_name(call)
        desc = _src(call.func)
        if isinstance(call.func, ast.Subscript):            # kernel[grid](...): a Triton launch
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
        if kw == "out":
            return _Use("partial" if partial else "write", line, f"{desc}(..., {kw}={_src(arg)})",
                        "medium" if partial else "high", view=view)
        if name in _READ_ONLY_CALLS:
            return _Use("meta", line, name)
        # a Python function (or custom op) defined in the files given
        fn = self.p.resolve(name)
        if fn is not None and self.depth < _MAX_DEPTH and fn.node is not self.fn.node:
            params = _params(fn.node)
            skip = 1 if params and params[0] in ("self", "cls") and (fn.is_method or isinstance(call.func, ast.Attribute)) else 0
            param = kw
            if param is None and arg in call.args:
                idx = call.args.index(arg) + skip
                param = params[idx] if idx < len(params) else None
            if param is not None and param in params:
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


def _short(s: str, n: int = 240) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


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


def _iter_files(paths: Iterable[str], exclude: list[str]) -> list[tuple[Path, str]]:
    out = []
    for p in paths:
        root = Path(p)
        if root.is_file():
            out.append((root, root.name if root.suffix == ".py" else str(root)))
            continue
        base = root.parent if root.name else root
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__"
                                 and not _excluded(os.path.relpath(os.path.join(dirpath, d), base), exclude))
            for f in sorted(filenames):
                if f.endswith(".py"):
                    full = os.path.join(dirpath, f)
                    rel = os.path.relpath(full, base)
                    if not _excluded(rel, exclude):
                        out.append((Path(full), rel))
    return out


def _excluded(rel: str, patterns: list[str]) -> bool:
    rel = rel.replace(os.sep, "/")
    return any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(os.path.basename(rel), g) or
               any(fnmatch.fnmatch(part, g) for part in rel.split("/")) for g in patterns)


def _hit_lines(src: _Source, pattern: re.Pattern) -> list[int]:
    """0-based numbers of the lines where ``pattern`` matches (a cheap pre-filter; the analysis is ast)."""
    out, line, pos = [], 0, 0
    for m in pattern.finditer(src.text):
        line += src.text.count("\n", pos, m.start())
        pos = m.start()
        if not out or out[-1] != line:
            out.append(line)
    return out


def audit_sources(sources: dict[str, str]) -> AuditResult:
    """Audit in-memory sources ``{display name: python source}`` (what :func:`audit` does after reading).

    Only the functions that hold a fill or an ``empty`` allocation are parsed, plus those the analysis
    follows (kernels, helpers, callers); a file whose function does not parse alone is parsed whole,
    and a file that does not parse is named in ``skipped``."""
    t0 = time.perf_counter()
    skipped: list[Skipped] = []
    srcs = {name: _Source(name, text) for name, text in sources.items()}
    project = _Project(srcs, skipped)
    findings: list[Finding] = []
    necessary: list[dict] = []
    helper_sites: list = []
    done: set[int] = set()
    for src in srcs.values():
        if "zero" not in src.text and "empty" not in src.text and "full" not in src.text and "fill_" not in src.text:
            continue
        for line0 in _hit_lines(src, _CAND_RE):
            if src.broken:
                break
            d = src.enclosing_def(line0)
            if d is None:
                continue
            for fn in project.load(src.name, d[0], d[1]):
                if id(fn.node) in done:
                    continue
                done.add(id(fn.node))
                try:
                    _analyze_function(project, fn, findings, necessary, helper_sites)
                except Exception as e:  # never stop a CI run on one odd function
                    skipped.append(Skipped(fn.file, f"audit error in {fn.qualname}: {type(e).__name__}: {e}"))
    try:
        _follow_helpers(project, helper_sites, findings, necessary)
    except Exception as e:
        skipped.append(Skipped("<helpers>", f"audit error while following helpers: {type(e).__name__}: {e}"))
    findings.sort(key=lambda f: (-_RANK[f.confidence], f.file, f.line))
    return AuditResult(findings, skipped, len(sources), time.perf_counter() - t0, necessary)


def audit(paths: Iterable[str] | str, exclude: Iterable[str] = ()) -> AuditResult:
    """Audit every ``.py`` file under ``paths`` (files or directories), skipping ``exclude`` globs
    (matched against the path relative to each given directory's parent, the file name, and each
    folder name). Files that cannot be read or parsed are listed in ``result.skipped``."""
    t0 = time.perf_counter()
    if isinstance(paths, (str, Path)):
        paths = [str(paths)]
    sources, unread = {}, []
    for full, rel in _iter_files(paths, list(exclude)):
        try:
            sources[rel] = full.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            unread.append(Skipped(rel, f"{type(e).__name__}: {e}"))
    res = audit_sources(sources)
    res.skipped = unread + res.skipped
    res.files = len(sources) + len(unread)
    res.seconds = time.perf_counter() - t0
    return res


# ---- output ---------------------------------------------------------------------------------------

def format_text(res: AuditResult, min_confidence: str = "low") -> str:
    shown = res.at_least(min_confidence)
    lines = []
    for f in shown:
        tag = {"zero-fill-then-overwrite": "zero fill then overwrite", "empty-partial-write": "REVERSE RISK: empty, partial writes"}[f.kind]
        flags = [n for n, v in (("padding", f.padding), ("view", f.view), ("partial slice", f.partial)) if v]
        lines.append(f"{f.where}: [{f.confidence}] {tag} ({f.pattern}) in {f.function}(): {f.code}"
                     + (f"  [{', '.join(flags)}]" if flags else ""))
        lines.append(f"    overwritten by: {f.overwrite}")
        lines.append(f"    why {f.confidence}: {'; '.join(f.reasons)}")
        lines.append(f"    to prove: {f.obligation}")
    for s in res.skipped:
        lines.append(f"skipped {s.file}: {s.error}")
    c = res.counts()
    lines.append(f"{len(shown)} finding(s) at or above '{min_confidence}' (high {c['high']}, medium {c['medium']}, "
                 f"low {c['low']}); {len(res.necessary)} zero fill(s) judged necessary; {res.files} file(s), "
                 f"{len(res.skipped)} skipped, {res.seconds:.2f} s")
    return "\n".join(lines)


def to_json(res: AuditResult, min_confidence: str = "low") -> dict:
    """The JSON document ``--json`` prints (schema version 1)."""
    return {
        "schema": "workbook.audit/1",
        "min_confidence": min_confidence,
        "files": res.files,
        "seconds": round(res.seconds, 3),
        "counts": res.counts(),
        "findings": [dict(asdict(f), where=f.where) for f in res.at_least(min_confidence)],
        "skipped": [asdict(s) for s in res.skipped],
        "necessary": res.necessary,
    }


# ---- command line ---------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The arguments of ``python -m workbook audit`` (call :func:`run` with the parsed namespace)."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help="Python files or directories to audit")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    parser.add_argument("--min-confidence", choices=CONFIDENCES, default="medium",
                        help="report (and fail on) findings at or above this confidence (default: medium)")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                        help="skip files/folders matching this glob (repeatable), e.g. 'tests' or '*/benchmarks/*'")
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the audit; exit code 1 when findings at or above --min-confidence exist, 2 for a bad path."""
    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:
        print(f"audit: no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    res = audit(args.paths, exclude=args.exclude)
    if args.json:
        print(json.dumps(to_json(res, args.min_confidence), indent=1))
    else:
        print(format_text(res, args.min_confidence))
    for s in res.skipped:
        print(f"audit: skipped {s.file}: {s.error}", file=sys.stderr)
    return 1 if res.at_least(args.min_confidence) else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbook audit",
                                description="List allocate-then-overwrite candidates (zero fills that are overwritten) "
                                            "and empty buffers written only through partial slices.")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())


# ---- exercise graders (notebook 07; they raise AssertionError with a message that teaches) ----------

#: What the proofs in notebook 07 establish for each candidate of the sample engine
#: (notebooks/audit_sample): 'empty' = the zero fill is redundant, 'zeros' = keep it, 'fix' = an
#: ``empty`` buffer that is not fully written: the writer (or the allocation) must change.
SAMPLE_VERDICTS = {
    "scale_rows": ("empty", "scale_rows_kernel stores every element of every row (grid M, mask N): poisoning "
                   "the zeros_like changes no output."),
    "new_output": ("empty", "its one caller launches scale_rows_kernel on the buffer, which writes all of it."),
    "gate_into": ("empty", "z_out[:] = sigmoid(z) writes every element right after the zero_()."),
    "row_scales": ("zeros", "row_amax_kernel writes rows [0, M) only, and group_scales reads whole groups of "
                   "GROUP rows, padding rows included: poisoned, the padding changes the consumer's result "
                   "(keep zeros, or make the kernel write the padding)."),
    "token_histogram": ("zeros", "histogram_kernel atomic_adds into counts: it reads the buffer, so the zeros "
                        "are the starting value of the count (coverage calls that 'read before written')."),
    "expert_sums": ("zeros", "index_add_ accumulates into acc: the zeros are part of the result."),
    "project_tokens": ("fix", "out is empty and only out[:num_tokens] is written: rows num_tokens.. hold "
                       "garbage that the caller receives. Allocate num_tokens rows, or write the padding."),
}
_CHOICES = ("empty", "zeros", "fix")


def check_verdicts(fn) -> None:
    """Grader of exercise 1: ``fn()`` returns {function name: 'empty' | 'zeros' | 'fix'} for the
    seven candidates of the sample engine."""
    got = fn()
    if not isinstance(got, dict):
        raise AssertionError(f"return a dict {{function name: verdict}}, got {type(got).__name__}")
    missing = sorted(set(SAMPLE_VERDICTS) - set(got))
    if missing:
        raise AssertionError(f"give a verdict for every candidate; missing: {missing}")
    bad_value = {k: v for k, v in got.items() if v not in _CHOICES}
    if bad_value:
        raise AssertionError(f"each verdict is one of {_CHOICES}; got {bad_value}")
    wrong = [(k, got[k]) for k in SAMPLE_VERDICTS if got[k] != SAMPLE_VERDICTS[k][0]]
    if wrong:
        lines = []
        for k, v in wrong:
            want, why = SAMPLE_VERDICTS[k]
            if v == "empty" and want == "zeros":
                lead = f"{k}: 'empty' would change results."
            elif v == "zeros" and want == "empty":
                lead = f"{k}: the zero fill is a memset for nothing."
            else:
                lead = f"{k}: '{v}' is not it (expected '{want}')."
            lines.append(f"{lead} {why}")
        raise AssertionError(f"{len(wrong)} of {len(SAMPLE_VERDICTS)} verdicts are wrong:\n  " + "\n  ".join(lines))


def mixed_batch_reference(decode_out, prefill_out):
    """What the mixed-batch writer of exercise 2 must return: decode rows first, then prefill rows."""
    import torch
    return torch.cat([decode_out, prefill_out])


def check_mixed_batch_writer(fn) -> None:
    """Grader of exercise 2: ``fn(decode_out [nd, D], prefill_out [npf, D])`` allocates its output
    with ``torch.empty`` and writes decode rows then prefill rows, covering every row; no zero fill."""
    import torch

    from . import coverage as cov
    gen = torch.Generator().manual_seed(7)
    for nd, npf, d in [(3, 5, 4), (1, 0, 8), (0, 4, 2), (6, 1, 3)]:
        dec = torch.randn(nd, d, generator=gen)
        pre = torch.randn(npf, d, generator=gen)
        with _ZeroFillSpy() as spy:
            fn(dec, pre)
        if spy.calls:
            raise AssertionError(f"nd={nd}, npf={npf}: your writer zero-fills ({', '.join(sorted(set(spy.calls)))}). "
                                 "The point is to allocate with torch.empty and prove that the two writes cover it.")
        covs = cov.coverage(fn, dec, pre, names=["out"])
        if len(covs) != 1:
            raise AssertionError(f"return one tensor, got {len(covs)}")
        c = covs[0]
        n = math_prod(c.storage_shape)
        if n != (nd + npf) * d:
            raise AssertionError(f"nd={nd}, npf={npf}: the buffer's storage has {n} elements; allocate exactly "
                                 f"nd + npf = {nd + npf} rows of {d} (a padded batch leaves rows nobody writes: "
                                 f"{c.unwritten_ranges('storage')})")
        if not c.storage_fully_written:
            raise AssertionError(f"nd={nd}, npf={npf}: elements never written (poison survives): "
                                 f"{c.unwritten_ranges('storage')}. The decode rows are [0, nd) and the prefill rows "
                                 "[nd, nd + npf): the two slices must meet exactly at nd.")
        got = fn(dec, pre)
        ref = mixed_batch_reference(dec, pre)
        if got.shape != ref.shape or not torch.equal(got, ref):
            raise AssertionError(f"nd={nd}, npf={npf}: every row is written, but not with the right rows: decode "
                                 "outputs go first (rows [0, nd)), then prefill outputs (rows [nd, nd + npf)).")


def _zero_fill_spy():
    import torch
    from torch.overrides import TorchFunctionMode

    class Spy(TorchFunctionMode):
        """Records zero fills (zeros, zeros_like, new_zeros, full(.., 0), zero_(), fill_(0))."""

        def __init__(self):
            super().__init__()
            self.calls: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if func in (torch.zeros, torch.zeros_like) or name in ("new_zeros", "zero_"):
                self.calls.append(name)
            elif name in ("full", "full_like", "new_full", "fill_"):
                v = args[1] if len(args) > 1 else kwargs.get("fill_value", kwargs.get("value"))
                if isinstance(v, (int, float)) and v == 0:
                    self.calls.append(f"{name}(.., 0)")
            return func(*args, **kwargs)

    return Spy()


class _ZeroFillSpy:
    def __enter__(self):
        self._mode = _zero_fill_spy()
        self._mode.__enter__()
        return self._mode

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)


def math_prod(shape) -> int:  # noqa: D401  (math.prod of a shape, kept local to stay import-light)
    n = 1
    for s in shape:
        n *= s
    return n
