"""Reading the sources: which files, their text, where their functions are, and parsing one def at
a time (:class:`_Index`), plus the small :mod:`ast` helpers the analysis shares.

A tree of thousands of files is mostly text that holds no zero fill, so nothing is parsed up front:
:class:`_Source` finds every ``def`` with a regular expression and its block by indentation, and
:meth:`_Index.load` parses a def on demand, keeping the file's line numbers: the outermost def that
holds it, once (a nested def shares its outer def's nodes and qualified name, so it is analysed once);
a file whose def does not parse alone is parsed whole and, if that fails too, named in ``skipped``.
Every lookup is linear in the file: the innermost def holding a line by bisection over the defs'
lines and a chain of parent defs, each block end computed once, a walk back for a qualified name
jumping over sibling bodies and sharing where it ends.

The files (:func:`_iter_files`): each ``.py`` file found is stat-ed before anything else (a named pipe,
device or socket is named and never opened), kept once per real file (device, inode: a folder and a
file in it, links) and named by its path from the folder given (two files never share a name);
:func:`_read_source` decodes a file as Python does (BOM, coding line, else UTF-8).
"""
from __future__ import annotations

import ast
import bisect
import errno
import fnmatch
import io
import os
import re
import stat
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from .results import Skipped


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
        d = _dotted(_launched(f.value))
        return d.rsplit(".", 1)[-1] if d else ""
    return ""


def _launched(node):
    """What ``X[grid](...)`` launches: ``X``, or ``kernel`` of ``torch.library.wrap_triton(kernel)`` (the
    launch torch.compile can trace; ``capture_triton`` is its former name)."""
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) and len(node.args) == 1 \
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) in ("wrap_triton", "capture_triton"):
        return node.args[0]
    return node


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


def _every_path_uses(fn, name: str, line: int) -> bool:
    """Is the use of ``name`` at ``line`` of ``fn`` (a :class:`_Func`) under ifs only, each of whose
    branches, an ``else`` included, uses ``name`` in a plain statement on every path (``if mode == 0:
    launch(.., buf) elif ..: launch(.., buf) else: launch(.., buf)``)? Then no test skips the use."""
    nodes = [n for n in fn.names.get(name, ()) if n.lineno == line]
    ctrl = _control(nodes[0], fn.parents) if nodes else [None]

    def covers(stmts) -> bool:
        return any(isinstance(st, ast.If) and covers(st.body) and covers(st.orelse) or
                   isinstance(st, (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return)) and
                   any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(st)) for st in stmts)
    return all(isinstance(c, ast.If) and covers([c]) for c in ctrl)


def _stmt_of(node, parents):
    while node is not None and not isinstance(node, ast.stmt):
        node = parents.get(node)
    return node



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

_CONST_RE = re.compile(r"^([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=(?!=)[ \t]*([-+(\w][^\n#]*)(?:#.*)?$", re.M)   # NAME = expr at column 0


def _int_value(e, known: dict) -> int | None:
    """An integer constant expression (literals, ``+ - * // % << >> **``, names in ``known``), else None."""
    if isinstance(e, ast.Constant) and type(e.value) is int:
        return e.value
    if isinstance(e, ast.Name):
        return known.get(e.id)
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        v = _int_value(e.operand, known)
        return None if v is None else (-v if isinstance(e.op, ast.USub) else v)
    if isinstance(e, ast.BinOp):
        a, b = _int_value(e.left, known), _int_value(e.right, known)
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.FloorDiv: lambda: a // b if b else None, ast.Mod: lambda: a % b if b else None,
               ast.LShift: lambda: a << b if 0 <= b < 64 else None, ast.RShift: lambda: a >> b if b >= 0 else None,
               ast.Pow: lambda: a ** b if 0 <= b < 64 else None}
        if a is not None and b is not None and type(e.op) in ops:
            return ops[type(e.op)]()
    return None


def _module_constants(text: str) -> dict[str, int]:
    """{name: value} for the names a file assigns at module level exactly once, to an integer constant
    expression (``QK_K = 256``, ``BLOCK = 2 * QK_K``), and nowhere else in the file (no other
    assignment at any indentation, no ``global``): what a size or bound written with them means."""
    known: dict[str, int] = {}
    assigned: dict[str, int] = {}   # each name's assignments at any indentation, counted in one pass over the file
    for m in _ASSIGN_RE.finditer(text):
        assigned[m.group(1)] = assigned.get(m.group(1), 0) + 1
    declared = {w for m in _GLOBAL_RE.finditer(text) for w in re.findall(r"\w+", m.group(1))}
    for m in _CONST_RE.finditer(text):
        name = m.group(1)
        if assigned.get(name) != 1 or name in declared:
            continue
        try:
            e = ast.parse(m.group(2).strip(), mode="eval").body
        except SyntaxError:
            continue
        v = _int_value(e, known)
        if v is not None:
            known[name] = v
    return known


class _ModuleConstants:
    """A def's view of its file's module-level integer constants (:func:`_module_constants`), less the names
    its parameters (or those of a def around it) shadow; read from the file the first time a def of it needs
    one (a size or a bound written with a name): most defs never do, and a large file costs a few passes."""

    def __init__(self, src, shadow: set):
        self.src, self.shadow = src, shadow

    def items(self):
        if self.src.constants is None:
            self.src.constants = _module_constants(self.src.text)
        return [(k, v) for k, v in self.src.constants.items() if k not in self.shadow]

    def __bool__(self):
        return bool(self.items())


_ASSIGN_RE = re.compile(r"^[ \t]*(\w+)[ \t]*(?::[^=\n]*)?(?:[-+*/%&|^@]|//|<<|>>|\*\*)?=(?!=)", re.M)
_GLOBAL_RE = re.compile(r"\bglobal\b([^\n]*)")


_DEF_RE = re.compile(r"def[ \t]+(\w+)")                # a def: a line's first word, or after "async"
_LEAD_RE = re.compile(r"([ \t]*)(?:async[ \t]+)?")
_CALL_REV_RE = re.compile(r"\(\s*(\w+)")                # a call "name(" in reversed text: a literal first
# a line that may hold a fill or an empty allocation as sites.py reads them: zeros / full / empty (and _like,
# _strided) called on torch or with no receiver, new_zeros / new_full / new_empty, zero_, fill_, an element set to 0
# (not cute.filter_zeros(, cutlass.full_like(, is_empty(, nor a default "x: T[int] = 0," in a signature)
# (the receiver of a ctor is checked by _candidate_lines: a lookbehind here makes the scan several times slower)
_CAND_RE = re.compile(r"zero(?:s(?:_like)?\(|_\()|fill_\(|full(?:_like)?\(|\]\s*=\s*0\b(?!\s*[,)\]])|empty(?:_like|_strided)?\(")
_CTORS = ("zeros", "full", "empty")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


class _Source:
    """One file: its text, every def found by text (:attr:`defs`: 0-based line, indentation, name, in
    order; nothing parsed yet), and its lines, split only when a def of it is needed.

    :meth:`enclosing_def` finds the innermost def holding a line by bisection over the defs' lines and
    a chain of parents (each def's nearest earlier def whose block reaches past its start), each block
    end computed once: a file's hits cost time linear in its size, not hits times defs."""

    def __init__(self, name: str, text: str):
        if "\r" in text:   # the line numbers of ast: \r\n and \r are line breaks
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        self.name, self.text = name, text
        self._lines: list[str] | None = None
        self.defs: list[tuple[int, int, str]] = []
        if "def" in text:
            line, pos = 0, 0
            for m in _DEF_RE.finditer(text):   # "def" found fast, then only blanks or "async" before it
                start = text.rfind("\n", 0, m.start()) + 1
                lead = _LEAD_RE.match(text, start, m.start())
                if lead is None or lead.end() != m.start():
                    continue
                line += text.count("\n", pos, start)   # offsets -> line numbers in one pass
                pos = start
                self.defs.append((line, len(lead.group(1).expandtabs()), m.group(1)))
        self._starts = [d[0] for d in self.defs]
        self._ends: dict[int, tuple[int, int]] = {}     # def line -> (end of its header, end of its block)
        self._parent: list[int] = []                    # parent def of defs[0..], filled in order on demand
        self.tree: ast.Module | None = None     # the whole file, parsed only when a segment fails
        self.broken: str | None = None
        self.constants: dict[str, int] | None = None   # module-level integer constants, read on first load
        self.segments: dict[int, ast.AST | None] = {}        # outermost def line -> its node, parsed alone
        self.seg_defs: dict[int, dict[int, ast.AST]] = {}     # (-1: the tree) -> the defs it holds by lineno
        self.qual_memo: dict[tuple[int, int], tuple] = {}    # (line, indentation) -> where a walk back ends

    @property
    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = self.text.split("\n")
        return self._lines

    def block_end(self, i: int, ind: int) -> int:
        """Index one past the last line of the def starting at line i (by indentation)."""
        if i not in self._ends:
            self._ends[i] = self._block_end(i, ind)
        return self._ends[i][1]

    def header_end(self, i: int, ind: int) -> int:
        """Index one past the last line of the header (``def ...:``) of the def starting at line i."""
        self.block_end(i, ind)
        return self._ends[i][0]

    def _block_end(self, i: int, ind: int) -> tuple[int, int]:
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
                    return j, j
        end = header = j
        while j < n:
            line = lines[j]
            s = line.lstrip()
            if s and s[0] != "#":
                lead = len(line) - len(s)   # the indentation, where it is spaces only (else tabs expanded)
                if (lead if line.count(" ", 0, lead) == lead else _indent(line.expandtabs())) <= ind:
                    break
                end = j + 1
            j += 1
        return header, end

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

    def _end(self, k: int) -> int:
        return self.block_end(self.defs[k][0], self.defs[k][1])

    def parent(self, k: int) -> int:
        """Index of the nearest earlier def whose block reaches past the start of ``defs[k]`` (-1: none).

        Following parents from a def visits, in decreasing order, every earlier def whose block holds
        its start (a def between a def's parent and itself ends before that def starts)."""
        par = self._parent
        while len(par) <= k:
            i = len(par)
            start, j = self.defs[i][0], i - 1
            while j >= 0 and self._end(j) <= start:
                j = par[j]
            par.append(j)
        return par[k]

    def def_at(self, line0: int) -> int:
        """Index in :attr:`defs` of the def starting at 0-based ``line0`` (-1: none)."""
        k = bisect.bisect_left(self._starts, line0)
        return k if k < len(self._starts) and self._starts[k] == line0 else -1

    def enclosing_def(self, line0: int):
        """The innermost def (line, indent, name) whose block holds 0-based line ``line0``."""
        k = bisect.bisect_right(self._starts, line0) - 1
        if k < 0:
            return None
        li = _indent(self.lines[line0].expandtabs()) if line0 < len(self.lines) else 0
        while k >= 0:
            d = self.defs[k]
            if d[0] == line0 or (d[1] < li and self._end(k) > line0):
                return d
            k = self.parent(k)
        return None

    def outermost_def(self, k: int) -> int:
        """The outermost def whose block holds the whole of ``defs[k]``, at a smaller indentation (``k``
        itself when none): parsing it once gives the def and every def nested in it the same nodes."""
        end, ind = self._end(k), self.defs[k][1]
        p = self.parent(k)
        while p >= 0:
            if self.defs[p][1] < ind and self._end(p) >= end:
                k, ind = p, self.defs[p][1]
            p = self.parent(p)
        return k

    def skip_block(self, k: int, cur: int) -> int:
        """For a walk back over the lines (:meth:`_Index._qual_prefix`): a line ``k`` inside the body of a
        def indented at least ``cur`` deep lies among lines that all are (blank, comments or) indented
        deeper than ``cur``; returns the last header line of the outermost such def (else ``k``)."""
        j = bisect.bisect_right(self._starts, k) - 1
        best = k
        while j >= 0:
            d = self.defs[j]
            if d[1] < cur:
                if self._end(j) > k:
                    break        # an enclosing def less indented: the walk stops there anyway
            elif self._end(j) > k and self.header_end(d[0], d[1]) <= k:
                best = min(best, self.header_end(d[0], d[1]) - 1)
            j = self.parent(j)
        return best


def _def_in(src: _Source, key: int, node, line0: int):
    """The def starting at 0-based ``line0`` inside ``node`` (a def parsed alone, or the whole tree)."""
    if node is None:
        return None
    if getattr(node, "lineno", None) == line0 + 1:
        return node
    if key not in src.seg_defs:   # a nested def: index the defs of the segment once
        src.seg_defs[key] = {n.lineno: n for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return src.seg_defs[key].get(line0 + 1)


@dataclass
class _Func:
    file: str
    node: ast.FunctionDef
    qualname: str
    parents: dict
    is_method: bool
    names: dict = field(default_factory=dict)    # dotted name -> its Name/Attribute nodes in this body
    stmts: list = field(default_factory=list)    # Assign/AnnAssign/Expr statements of this body
    blocks: object | None = None                 # _Blocks: each statement's place in its block, lazily
    consts: object = None                        # _ModuleConstants: module-level integer constants it does not shadow


_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


class _Blocks:
    """Each statement's (index in its block, the index of that block's first return/raise/continue/break
    or a large number, the next return/raise after it in its block or None), computed for a whole block
    the first time one of its statements is asked about (:meth:`get`, given its parent): what
    :func:`_unreachable` and :func:`_exit_after` walk up from costs the blocks on that path, never the
    whole function (a generated kernel of 40,000 nodes holding one fill)."""

    def __init__(self):
        self.where: dict[int, tuple] = {}
        self.done: set[int] = set()

    def get(self, child, parent, default):
        if id(child) not in self.where and parent is not None and id(parent) not in self.done:
            self.done.add(id(parent))
            for fname in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(parent, fname, None)
                if isinstance(block, list):
                    first_exit = next((i for i, s in enumerate(block) if isinstance(s, _EXITS)), 1 << 30)
                    following = None
                    for i in range(len(block) - 1, -1, -1):
                        self.where[id(block[i])] = (i, first_exit, following)
                        if isinstance(block[i], (ast.Return, ast.Raise)):
                            following = block[i]
        return self.where.get(id(child), default)


def _unreachable(st, parents, root, where: _Blocks) -> bool:
    """Does ``st`` (or a statement holding it) follow a return/raise/continue/break in ITS block (not
    in a sibling branch: an ``else: return`` leaves the ``if`` branch reachable)?"""
    child = st
    while child is not None and child is not root:
        index, first_exit, _ = where.get(child, parents.get(child), (0, 1 << 30, None))
        if first_exit < index:
            return True
        child = parents.get(child)
    return False


def _exit_after(start, parents, root, where: _Blocks):
    """The ``return``/``raise`` that ends every path from ``start``: the first one after ``start`` in
    its block or in an enclosing block (not nested in a branch). Code after it in the source, a later
    kernel launch after the enclosing ``if`` included, never runs after ``start``. None if none."""
    child = start
    while child is not None and child is not root:
        following = where.get(child, parents.get(child), (0, 0, None))[2]
        if following is not None:
            return following
        child = parents.get(child)
    return None


_DEF_TYPES = {ast.FunctionDef, ast.AsyncFunctionDef}
_SCOPE_TYPES = {ast.Lambda, ast.ClassDef}
_STMT_TYPES = {ast.Assign, ast.AnnAssign, ast.Expr, ast.Return}
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}   # per node type, its fields but ``ctx`` (shared Load/Store)


def _index_def(root) -> tuple[dict, dict[int, tuple[list, dict]]]:
    """One pass over a def: parent links, and per (nested) def its statements and name occurrences."""
    parents: dict = {}
    owned: dict = {id(root): ([], {})}
    defs: list = []
    stack = [(root, root)]
    node_type = ast.AST
    name_type, attr_type = ast.Name, ast.Attribute
    while stack:
        n, owner = stack.pop()
        stmts, names = owned[id(owner)]
        fields = _CHILD_FIELDS.get(type(n))
        if fields is None:
            fields = _CHILD_FIELDS[type(n)] = tuple(f for f in type(n)._fields if f != "ctx")
        for fname in fields:
            v = getattr(n, fname, None)
            if isinstance(v, list):
                children = v
            elif isinstance(v, node_type):
                children = (v,)
            else:
                continue
            for c in children:
                if not isinstance(c, node_type):
                    continue
                parents[c] = n
                o = owner
                t = type(c)
                if t in _DEF_TYPES:
                    o = c
                    owned[id(c)] = ([], {})
                    defs.append((c, owner))
                elif t in _SCOPE_TYPES:
                    o = c
                    owned[id(c)] = ([], {})
                if t is name_type:
                    names.setdefault(c.id, []).append(c)
                elif t is attr_type:
                    d = _dotted(c)
                    if d is not None:
                        names.setdefault(d, []).append(c)
                elif t in _STMT_TYPES:
                    stmts.append(c)
                stack.append((c, o))
    if defs:
        owned["defs"] = defs
    return parents, owned


class _Index:
    """The files given: every def by name, and its functions parsed on demand, one def at a time
    (:meth:`load`, :meth:`resolve`). Functions are parsed on demand, one def at a time (a file is parsed whole only if a def of it
    does not parse alone): a large tree is mostly text that holds no zero fill."""

    def __init__(self, sources: dict[str, _Source], skipped: list):
        self.sources = sources
        self.skipped = skipped
        self.index: dict[str, list[tuple[str, int, int]]] = {}
        for src in sources.values():
            for ln, ind, name in src.defs:
                self.index.setdefault(name, []).append((src.name, ln, ind))
        self.loaded: dict[tuple[str, int], list[_Func]] = {}
        self._resolved: dict[str, _Func | None] = {}

    def _qual_prefix(self, src: _Source, line0: int, ind: int) -> tuple[str, bool]:
        """The enclosing classes and defs of the def at ``line0`` (``"A.f."``) and whether it is a method:
        a walk back over the lines, each less indented line a step out. Linear in the file: a sibling's
        body is jumped over (:meth:`_Source.skip_block`) and a walk that reaches where an earlier one
        started, with nothing found yet, ends as that one did (siblings share their prefix)."""
        names, cur, is_method = [], ind, False
        memo, met = src.qual_memo, []
        k = line0 - 1
        while k >= 0 and cur > 0:
            if not names:
                if (k, cur) in memo:
                    names, is_method = list(memo[k, cur][0]), memo[k, cur][1]
                    break
                met.append((k, cur))
            line = src.lines[k]
            s = line.lstrip()
            if not s or s.startswith("#"):
                k -= 1
                continue
            li = _indent(line.expandtabs())
            if li < cur:
                m = re.match(r"(?:async\s+)?(def|class)\s+(\w+)", s)
                if m:
                    if not names:
                        is_method = m.group(1) == "class"
                    names.append(m.group(2))
                cur = li
                k -= 1
            else:   # inside a sibling's body: jump to its header
                j = src.skip_block(k, cur)
                k = j if j < k else k - 1
        for state in met:
            memo[state] = (tuple(names), is_method)
        return ".".join(reversed(names)) + ("." if names else ""), is_method

    def load(self, file: str, line0: int, ind: int) -> list[_Func]:
        """Parse the def at 0-based ``line0`` of ``file``; returns its functions (nested ones too)."""
        key = (file, line0)
        if key in self.loaded:
            return self.loaded[key]
        src = self.sources[file]
        self.loaded[key] = []
        node = self._def_node(src, line0, ind)
        if node is None:
            return []
        funcs = self._from_outer(src, line0, node)
        if funcs is None:
            parents, owned = _index_def(node)
            prefix, is_method = self._qual_prefix(src, line0, ind)
            funcs = []
            todo = [(node, prefix + node.name, is_method, set())]
            while todo:   # the def, then its nested defs, depth first (a loop: no closure cycle keeps ASTs alive)
                fnode, qual, method, shadow = todo.pop()
                stmts, names = owned.get(id(fnode), ([], {}))
                shadow = shadow | set(_params(fnode))          # a parameter (of it or a def around it) hides a constant
                consts = _ModuleConstants(src, shadow)
                funcs.append(_Func(file, fnode, qual, parents, method, names, sorted(stmts, key=lambda n: n.lineno),
                                   consts=consts))
                nested = [d for d, o in owned.get("defs", []) if o is fnode]
                todo += [(st, qual + "." + st.name, False, shadow) for st in reversed(nested)]
        self.loaded[key] = funcs
        return funcs

    def _from_outer(self, src: _Source, line0: int, node) -> list[_Func] | None:
        """A nested def's functions as its outermost def has them (indexed once, one qualified name
        whichever is loaded first), or None (not nested, or out of the outer def's reach)."""
        k = src.def_at(line0)
        r = src.outermost_def(k) if k >= 0 else k
        if r == k:
            return None
        outer = self.load(src.name, src.defs[r][0], src.defs[r][1])
        i = next((i for i, f in enumerate(outer) if f.node is node), None)
        if i is None:
            return None
        prefix, j = outer[i].qualname + ".", i + 1
        while j < len(outer) and outer[j].qualname.startswith(prefix):
            j += 1
        return outer[i:j]

    def _def_node(self, src: _Source, line0: int, ind: int):
        """The def at ``line0`` as parsed: from the segment of its outermost enclosing def, parsed once
        (a nested def and its outer one share their nodes), else from the file parsed whole, else (a
        file that does not parse) from its own segment."""
        if src.tree is None:
            k = src.def_at(line0)
            root = src.defs[src.outermost_def(k)] if k >= 0 else (line0, ind, "")
            if root[0] not in src.segments:
                src.segments[root[0]] = self._parse_segment(src, root[0], root[1])
            node = _def_in(src, root[0], src.segments[root[0]], line0)
            if node is not None:
                return node
            if src.broken is None:
                self._parse_whole(src)
        if src.tree is not None:
            return _def_in(src, -1, src.tree, line0)
        if (line0, ind) != (root[0], root[1]):
            return self._parse_segment(src, line0, ind)
        return None

    @staticmethod
    def _parse_segment(src: _Source, line0: int, ind: int) -> ast.AST | None:
        """Parse the def at ``line0`` alone (with its decorators, keeping the file's line numbers):
        its node, or None when it does not parse alone."""
        start, end = src.deco_start(line0, ind), src.block_end(line0, ind)
        text = "\n".join(src.lines[start:end])
        try:
            if start <= 1000 * (end - start):   # blank lines in front keep the file's line numbers
                mod = ast.parse(("\n" * (start - 1) + "if 1:\n" + text) if ind and start else ("\n" * start + text))
            else:   # far down a large file: renumbering the def's nodes costs less than the blank lines
                mod = ast.parse(("if 1:\n" + text) if ind else text)
                ast.increment_lineno(mod, start - 1 if ind else start)
            body = mod.body[0].body if ind else mod.body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
        return node if node is not None and node.lineno == line0 + 1 else None

    def _parse_whole(self, src: _Source):
        try:
            src.tree = ast.parse(src.text, filename=src.name)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            where = f" line {e.lineno}" if isinstance(e, SyntaxError) and e.lineno else ""
            src.broken = f"{type(e).__name__}{where}: {getattr(e, 'msg', None) or e}"
            self.skipped.append(Skipped(src.name, src.broken, "syntax"))

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


# ---- the files ------------------------------------------------------------------------------------

_SPECIAL = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
            (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> str:
    what = next((name for test, name in _SPECIAL if test(mode)), "not a regular file")
    return f"{what}, not a regular file: not opened"


def _iter_files(paths: Iterable[str], exclude: list[str]) -> tuple[list[tuple[str, str]], list[Skipped]]:
    """The ``.py`` files under ``paths`` (files or folders), each real file once, as (path, display
    name), and what was met but cannot be audited: special files (pipes, devices, sockets: stat-ed,
    never opened), paths that cannot be stat-ed, folders that cannot be listed.

    A file in a folder is named by its path from the folder's parent (``pkg/mod.py``), a file given
    alone by its path as given (relative to the working folder when inside it); where two different
    files would get one name, both are named by their full path as given. A file met twice (a folder
    and a file in it, two spellings, a symbolic or hard link) is kept once, where it is first met."""
    found: list[tuple[str, str, str]] = []     # (path, name, long name)
    skipped: list[Skipped] = []
    seen: set[tuple[int, int]] = set()

    def add(full: str, name: str, long: str):
        try:
            st = os.stat(full)
        except OSError as e:
            skipped.append(Skipped(name, f"{type(e).__name__}: {e.strerror or e}", "unreadable"))
            return
        if not stat.S_ISREG(st.st_mode):
            skipped.append(Skipped(name, _not_regular(st.st_mode), "special"))
            return
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            found.append((full, name, long))

    for p in map(str, paths):
        root = Path(p)
        if not root.is_dir():
            add(p, _given_name(p), os.path.normpath(p))
            continue
        base = root.parent if root.name else root
        for dirpath, dirnames, filenames in os.walk(root, onerror=lambda e: skipped.append(Skipped(
                os.path.relpath(e.filename, base) if e.filename else p, f"{type(e).__name__}: cannot list the "
                f"folder: {e.strerror or e}", "folder"))):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__"
                                 and not _excluded(os.path.relpath(os.path.join(dirpath, d), base), exclude))
            for f in sorted(filenames):
                if f.endswith(".py"):
                    full = os.path.join(dirpath, f)
                    rel = os.path.relpath(full, base)
                    if not _excluded(rel, exclude):
                        add(full, rel, os.path.normpath(full))
    return _unique_names(found), skipped


def _given_name(p: str) -> str:
    p = os.path.normpath(p)
    if os.path.isabs(p):
        rel = os.path.relpath(p, os.getcwd())
        return p if rel.startswith("..") else rel
    return p


def _unique_names(found: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    count: dict[str, int] = {}
    for _, name, _ in found:
        count[name] = count.get(name, 0) + 1
    out, used = [], set()
    for full, name, long in found:
        if count[name] > 1:
            name = long if long not in used else f"{long} ({os.path.realpath(full)})"
        used.add(name)
        out.append((full, name))
    return out


def _read_source(path: str) -> str:
    """A file's text as Python reads it: decoded by its BOM or coding line (else UTF-8), universal
    newlines. Opened without blocking and checked again once open: a file swapped for a pipe after
    the walk is reported (OSError), not waited on."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    with open(fd, "rb", closefd=True) as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, _not_regular(mode))
        data = fh.read()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)   # SyntaxError: a bad coding line
    text = data.decode(encoding)
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _excluded(rel: str, patterns: list[str]) -> bool:
    rel = rel.replace(os.sep, "/")
    return any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(os.path.basename(rel), g) or
               any(fnmatch.fnmatch(part, g) for part in rel.split("/")) for g in patterns)


def _call_lines(src: _Source, names) -> list[int]:
    """0-based numbers of the lines where one of ``names`` is called (``name(``, as ``\\bname\\s*\\(``).

    The text is searched reversed, for ``(`` then the word before it: a regular expression that starts
    with a literal is a fast scan, where an alternation of many names costs time per name and byte."""
    text = src.text
    rev_names = {n[::-1] for n in names}
    n = len(text)
    offs = sorted(n - m.end() for m in _CALL_REV_RE.finditer(text[::-1]) if m.group(1) in rev_names)
    out, line, pos = [], 0, 0
    for o in offs:
        line += text.count("\n", pos, o)
        pos = o
        if not out or out[-1] != line:
            out.append(line)
    return out


def _candidate_lines(src: _Source) -> list[int]:
    """0-based numbers of the lines that may hold a fill or an empty allocation (:data:`_CAND_RE`, a ctor's
    receiver checked), comment lines aside: a cheap pre-filter; the analysis is ast."""
    out, line, pos, text = [], 0, 0, src.text
    for m in _CAND_RE.finditer(text):
        if m.group().startswith(_CTORS):   # torch.zeros(, zeros(, x.new_zeros(: not cute.filter_zeros(
            before = text[max(0, m.start() - 6): m.start()]
            prev = before[-1:]
            if prev and (prev.isalnum() or prev in "_.") and not before.endswith(("torch.", ".new_")):
                continue
        line += text.count("\n", pos, m.start())
        pos = m.start()
        if (not out or out[-1] != line) and not text[text.rfind("\n", 0, pos) + 1: pos].lstrip().startswith("#"):
            out.append(line)
    return out
