"""Reading the sources: which files, their text, where their functions are, and parsing one def at
a time (:class:`_Index`), plus the small :mod:`ast` helpers the analysis shares.

A tree of thousands of files is mostly text that holds no zero fill, so nothing is parsed up front:
:class:`_Source` finds every ``def`` with a regular expression and its block by indentation, and
:meth:`_Index.load` parses one def (with its decorators) on demand, keeping the file's line numbers; a
file whose def does not parse alone is parsed whole and, if that fails too, named in ``skipped``.
"""
from __future__ import annotations

import ast
import fnmatch
import os
import re
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


# ---- the files ------------------------------------------------------------------------------------

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
