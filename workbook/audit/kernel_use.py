"""How a Triton kernel of the files uses a pointer parameter (:class:`_Kernels`, a part of
:class:`workbook.audit.analyzer._Project`): 'store' when it is only stored through, 'store-dd' when
where it stores depends on values it loads (indices, lengths), 'store-early' when it may return early, 'load',
'rmw' (loaded and stored, or ``atomic_*``), 'none'. The pointer is followed through local pointer
arithmetic and into ``@triton.jit`` helpers it is passed to (up to a few calls deep). A store whose
address, mask or enclosing loop depends on loaded values ('store-dd') writes a set the data decides:
the elements it skips keep what was there (the zeros), so the audit only suspects it (low), and so
is a store under ``if i_i > i_j:`` (two program ids compared, no ``else``: 'store-part', a triangle of
blocks); an early ``return`` alone ('store-early') is the usual bounds guard (medium)."""
from __future__ import annotations

import ast

from .source import _call_name, _dotted, _Func, _params

_MAX_DEPTH = 4


def _names_in(node) -> set[str]:
    return {x.id for x in ast.walk(node) if isinstance(x, ast.Name)}


def _tainted(body: list, param: str) -> set[str]:
    """``param`` and the local names computed from it (pointer arithmetic, block pointers), in a
    kernel's nodes ``body``."""
    taint = {param}
    for _ in range(3):  # propagate through local pointer arithmetic / block pointers
        for n in body:
            if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and n.value is not None:
                if _names_in(n.value) & taint:
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    for t in targets:
                        taint |= _names_in(t)
    return taint


def _loaded_names(body: list, source: str = "load") -> set[str]:
    """The local names of a kernel that hold values read from memory (``tl.load``), or computed from them
    (``source='program_id'``: the names computed from the program ids)."""
    loaded: set[str] = set()
    for _ in range(3):
        for n in body:
            if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and n.value is not None:
                has_load = any(isinstance(x, ast.Call) and _call_name(x) == source for x in ast.walk(n.value))
                if has_load or _names_in(n.value) & loaded:
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    for t in targets:
                        loaded |= _names_in(t)
            elif isinstance(n, ast.If) and source == "load" and _names_in(n.test) & loaded:
                # a flag set under a test of a loaded value (``if label == ignore: skip = True``) holds
                # that value too: stores it decides are data dependent
                for st in ast.walk(n):
                    if isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                        for t in (st.targets if isinstance(st, ast.Assign) else [st.target]):
                            loaded |= _names_in(t)
    return loaded


def _between_programs(test, pid: set) -> bool:
    """A test that compares two values computed from program ids (``i_i > i_j``): a triangle or a band
    of the programs, not a bounds guard (``pid < n``)."""
    for c in ast.walk(test):
        if isinstance(c, ast.Compare) and len(c.ops) == 1 and _names_in(c.left) & pid \
                and _names_in(c.comparators[0]) & pid:
            return True
    return False


def _exhaustive(node: ast.If) -> bool:
    """Does the if/elif chain starting at ``node`` end in a plain ``else``?"""
    while len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
        node = node.orelse[0]
    return bool(node.orelse)


class _Kernels:
    """The kernel summaries of :class:`~workbook.audit.analyzer._Project` (which sets
    ``_kernel_summary``, ``_bodies``, ``_loaded`` and provides ``resolve_all``)."""

    # -- Triton kernels: how does a kernel use the pointer it gets in parameter p?
    def kernel_use(self, fn: _Func, param: str, depth: int = 0) -> str:
        """'store' (only stored through), 'store-dd' (only stored, but where depends on loaded values),
        'store-part' (only stored, by the programs one side of a comparison of program ids picks),
        'store-early' (only stored, the kernel may return early), 'load', 'rmw' (loaded and stored, or
        atomics), 'none'."""
        key = (id(fn.node), param)
        if key in self._kernel_summary:
            return self._kernel_summary[key]
        self._kernel_summary[key] = "none"
        body = self._bodies.get(id(fn.node))
        if body is None:
            body = self._bodies[id(fn.node)] = list(ast.walk(fn.node))
        taint = _tainted(body, param)
        if id(fn.node) not in self._loaded:   # the same for every parameter: once per kernel
            self._loaded[id(fn.node)] = (_loaded_names(body), _loaded_names(body, "program_id"))
        # values read from memory: stores that depend on them cover a data-dependent set
        loaded, pid = self._loaded[id(fn.node)]
        early_return = any(isinstance(n, ast.Return) for n in body)
        acc = {"stores": False, "loads": False, "atomics": False, "dd": False, "part": False, "pid": pid}
        for n in body:
            if isinstance(n, ast.Call):
                self._kernel_call(fn, n, taint, loaded, acc, depth)
        res = "rmw" if acc["atomics"] or (acc["stores"] and acc["loads"]) else "store" if acc["stores"] \
            else "load" if acc["loads"] else "none"
        if res == "store" and (acc["dd"] or acc["part"] or early_return):
            res = "store-dd" if acc["dd"] else "store-part" if acc["part"] else "store-early"
        self._kernel_summary[key] = res
        return res

    def _kernel_call(self, fn: _Func, n: ast.Call, taint: set, loaded: set, acc: dict, depth: int) -> None:
        """One call in a kernel's body: a store/load/atomic through the pointer, or a jit helper given it."""
        name = _call_name(n)
        ptr = None
        if name in ("store", "load") or name.startswith("atomic_"):
            if isinstance(n.func, ast.Attribute) and _dotted(n.func.value) not in ("tl", "triton.language"):
                ptr = n.func.value   # desc.store(...), block_ptr style methods
            else:
                ptr = n.args[0] if n.args else next((k.value for k in n.keywords if k.arg in ("pointer", "ptr")), None)
        if ptr is not None:
            if _names_in(ptr) & taint:
                if name == "store":
                    acc["stores"] = True
                    mask = next((k.value for k in n.keywords if k.arg == "mask"), n.args[2] if len(n.args) > 2 else None)
                    used = {x for e in (ptr, mask) if e is not None for x in _names_in(e)}
                    loop = fn.parents.get(n)
                    while loop is not None and loop is not fn.node:
                        if isinstance(loop, (ast.For, ast.While, ast.If)):   # the store runs when a loaded value says
                            used |= _names_in(getattr(loop, "iter", None) or loop.test)
                        if isinstance(loop, ast.If) and _between_programs(loop.test, acc["pid"]) \
                                and not _exhaustive(loop):
                            acc["part"] = True    # if i_i > i_j: ... (no else): some programs store nothing
                        loop = fn.parents.get(loop)
                    acc["dd"] |= bool(used & loaded)
                elif name == "load":
                    acc["loads"] = True
                else:
                    acc["atomics"] = True
            return
        hits = [i for i, a in enumerate(n.args) if _names_in(a) & taint]
        if not hits or depth >= _MAX_DEPTH:
            return
        for callee in self.resolve_all(name, fn.file)[0]:   # a @triton.jit helper called with our pointer
            params = _params(callee.node)
            for i in hits:
                if i < len(params):
                    u = self.kernel_use(callee, params[i], depth + 1)
                    acc["stores"] |= u in ("store", "store-dd", "store-part", "store-early", "rmw")
                    acc["part"] |= u == "store-part"
                    acc["loads"] |= u in ("load", "rmw")
                    acc["dd"] |= u == "store-dd"
