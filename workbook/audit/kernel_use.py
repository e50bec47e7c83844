"""How a Triton kernel of the files uses a pointer parameter (:class:`_Kernels`, a part of
:class:`workbook.audit.analyzer._Project`): 'store' when it is only stored through, 'store-dd' when
where it stores depends on values it loads (indices, lengths), 'store-early' when it may return early, 'load',
'rmw' (loaded and stored, or ``atomic_*``), 'none'. The pointer is followed through local pointer
arithmetic and into ``@triton.jit`` helpers it is passed to (up to a few calls deep). A store whose
address, mask or enclosing loop depends on loaded values ('store-dd') writes a set the data decides:
the elements it skips keep what was there (the zeros), so the audit only suspects it (low), and so
is a store under ``if i_i > i_j:`` (two program ids compared, no ``else``: 'store-part', a triangle of
blocks); an early ``return`` alone ('store-early') is the usual bounds guard (medium).

A store mask is a bounds guard when its terms are upper bounds (``offs < n``); a term that selects
among in-bounds elements (a lower bound ``k >= 0``, ``k > c``, ``0 <= k``, a triangle ``i >= j``; an
equality on program ids picks programs, not elements, and is left alone) makes the stores cover a
subset the kernel picks ('store-sel': a scatter into part of the buffer, the rest keeps what was
there), and so does an address that misses a part (:func:`workbook.audit.offsets.store_gap`: a start
past index 0, a diagonal, a program id added to an arange) when it is so for *every* store of the
parameter (a helper's stores count as one): another store that reaches the rest (``tl.store(out, 0)``
beside ``out + 1 + offs``) keeps the whole write; the note that goes with 'store-sel'
(:meth:`_Kernels.selecting_note`) says which. A parameter named in the kernel's own
``@triton.autotune(reset_to_zero=[...])`` is one the kernel relies on finding zeroed ('zeroed'): its
authors say so. :meth:`_Kernels.store_sites` lists, per store of a parameter, the program-id axes
its address follows and the names it is computed from, for the launch to compare with its grid.
:meth:`_Kernels.stores_whole` says whether a parameter's plain stores, its loads aside, pass the test a
'store' parameter passes (a read-modify-write kernel that writes every element it is launched over)."""
from __future__ import annotations

import ast

from .offsets import store_gap
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


_SELECT_OPS = (ast.GtE, ast.Gt)


def _assignments(body: list) -> dict[str, list]:
    """name -> the expressions a kernel assigns to it (a ``for`` target: its iterable)."""
    defs: dict[str, list] = {}
    for n in body:
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and n.value is not None:
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                for nm in _names_in(t):
                    defs.setdefault(nm, []).append(n.value)
        elif isinstance(n, ast.For):
            for nm in _names_in(n.target):
                defs.setdefault(nm, []).append(n.iter)
    return defs


def _selecting_term(mask, defs: dict, depth: int = 4) -> str | None:
    """The first term of a store mask that selects among in-bounds elements (not an upper bound): the
    mask's ``&``/``|`` terms, followed through the names they were assigned from."""
    if depth < 0 or mask is None:
        return None
    if isinstance(mask, ast.BinOp) and isinstance(mask.op, (ast.BitAnd, ast.BitOr)):
        return _selecting_term(mask.left, defs, depth) or _selecting_term(mask.right, defs, depth)
    if isinstance(mask, ast.Subscript):                 # row_ok[:, None]
        return _selecting_term(mask.value, defs, depth)
    if isinstance(mask, ast.Name):
        for v in defs.get(mask.id, ()):
            t = _selecting_term(v, defs, depth - 1)
            if t is not None:
                return t
        return None
    if isinstance(mask, ast.Compare):
        lefts = [mask.left] + mask.comparators[:-1]
        for op, left, right in zip(mask.ops, lefts, mask.comparators):
            const_left = isinstance(left, (ast.Constant, ast.UnaryOp))
            if isinstance(op, _SELECT_OPS) or (isinstance(op, (ast.Lt, ast.LtE)) and const_left):
                return ast.unparse(mask)
    return None


def _depends(expr, defs: dict, depth: int = 6) -> tuple[set, set]:
    """The names ``expr`` is computed from (through the kernel's assignments) and the program-id axes
    among them (``tl.program_id(0)`` directly or through a name)."""
    names, axes, seen = set(), set(), set()
    frontier = [expr]
    for _ in range(depth):
        nxt = []
        for e in frontier:
            for x in ast.walk(e):
                if isinstance(x, ast.Call) and _call_name(x) == "program_id":
                    a = x.args[0] if x.args else next((k.value for k in x.keywords if k.arg == "axis"), None)
                    if isinstance(a, ast.Constant):
                        axes.add(a.value)
                elif isinstance(x, ast.Name) and x.id not in seen:
                    seen.add(x.id)
                    names.add(x.id)
                    nxt += defs.get(x.id, [])
        frontier = nxt
    return names, axes


def _grid_meta_axes(grid, fn: _Func) -> dict[int, set]:
    """For a launch grid given as a lambda or local def of the launch config (``lambda meta:
    (cdiv(N, meta["BLOCK_N"]), M)``): axis -> the config keys its extent reads."""
    node = grid
    if isinstance(grid, ast.Name):
        node = None
        for occ in fn.names.get(grid.id, ()):
            st = fn.parents.get(occ)
            if isinstance(getattr(occ, "ctx", None), ast.Store) and isinstance(st, ast.Assign) \
                    and isinstance(st.value, ast.Lambda):
                node = st.value
        if node is None:
            node = next((d for d in ast.walk(fn.node) if isinstance(d, ast.FunctionDef) and d.name == grid.id
                         and d is not fn.node), None)
    if isinstance(node, ast.Lambda):
        body = node.body
    elif isinstance(node, ast.FunctionDef):
        body = next((r.value for r in reversed(list(ast.walk(node))) if isinstance(r, ast.Return) and r.value), None)
    else:
        return {}
    meta = _params(node)
    if not meta or body is None:
        return {}
    out = {}
    for i, e in enumerate(body.elts if isinstance(body, ast.Tuple) else [body]):
        keys = {x.slice.value for x in ast.walk(e) if isinstance(x, ast.Subscript) and isinstance(x.value, ast.Name)
                and x.value.id == meta[0] and isinstance(x.slice, ast.Constant) and isinstance(x.slice.value, str)}
        if keys:
            out[i] = keys
    return out


def _reset_to_zero(node) -> set[str]:
    """The parameters a kernel's ``@triton.autotune(..., reset_to_zero=[...])`` names."""
    out = set()
    for d in getattr(node, "decorator_list", []):
        if isinstance(d, ast.Call) and _call_name(d) == "autotune":
            for k in d.keywords:
                if k.arg == "reset_to_zero" and isinstance(k.value, (ast.List, ast.Tuple)):
                    out |= {e.value for e in k.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return out


def _between_programs(test, pid: set) -> bool:
    """A test that compares two values computed from program ids (``i_i > i_j``): a triangle or a band
    of the programs, not a bounds guard (``pid < n``)."""
    for c in ast.walk(test):
        if isinstance(c, ast.Compare) and len(c.ops) == 1 and _names_in(c.left) & pid \
                and _names_in(c.comparators[0]) & pid:
            return True
    return False


def _from_pid(expr, pid: set) -> bool:
    """Is ``expr`` computed from a program id (``tl.program_id(..)`` in it, or a name in ``pid``)?"""
    return bool(_names_in(expr) & pid) or any(isinstance(x, ast.Call) and _call_name(x) == "program_id"
                                              for x in ast.walk(expr))


def _exhaustive(node: ast.If) -> bool:
    """Does the if/elif chain starting at ``node`` end in a plain ``else``?"""
    while len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
        node = node.orelse[0]
    return bool(node.orelse)


class _Kernels:
    """The kernel summaries of :class:`~workbook.audit.analyzer._Project` (which sets
    ``_kernel_summary``, ``_bodies``, ``_loaded`` and provides ``resolve_all``)."""

    # -- Triton kernels: how does a kernel use the pointer it gets in parameter p?
    def kernel_use(self, fn: _Func, param: str, depth: int = 0, given: frozenset = frozenset()) -> str:
        """'store' (only stored through), 'store-dd' (only stored, but where depends on loaded values),
        'store-part' (only stored, by the programs one side of a comparison of program ids picks),
        'store-sel' (only stored, under a mask that selects among in-bounds elements: see
        :meth:`selecting_note`), 'store-early' (only stored, the kernel may return early), 'load',
        'rmw' (loaded and stored, or atomics), 'zeroed' (the kernel's autotune resets it to zero), 'none'.
        ``given``: a jit helper's parameters that its call fills with the program's position (a block index
        computed from program ids): part of the key, so that the answer depends on the call, never on which
        call was summarised first."""
        key = (id(fn.node), param, given)
        if key in self._kernel_summary:
            return self._kernel_summary[key]
        self._kernel_summary[key] = "none"
        if param in _reset_to_zero(fn.node):
            self._kernel_summary[key] = "zeroed"
            return "zeroed"
        body = self._body(fn)
        taint = _tainted(body, param)
        # values read from memory: stores that depend on them cover a data-dependent set
        loaded, pid, _ = self._loaded[id(fn.node)]
        pid = pid | given
        early_return = any(isinstance(n, ast.Return) for n in body)
        acc = {"stores": False, "loads": False, "atomics": False, "dd": False, "part": False, "sel": None,
               "pid": pid, "sites": 0, "gaps": [], "side_bad": False}
        for n in body:
            if isinstance(n, ast.Call):
                self._kernel_call(fn, n, taint, loaded, acc, depth)
        res = "rmw" if acc["atomics"] or (acc["stores"] and acc["loads"]) else "store" if acc["stores"] \
            else "load" if acc["loads"] else "none"
        # every store's address misses a part (a shift, a diagonal, a program id added): no store reaches it
        gap = acc["gaps"][0] if acc["gaps"] and len(acc["gaps"]) == acc["sites"] else None
        if res == "store" and (acc["dd"] or acc["part"] or acc["sel"] or gap or early_return):
            res = "store-dd" if acc["dd"] else "store-part" if acc["part"] else "store-sel" if acc["sel"] or gap \
                else "store-early"
        if acc["sel"] or gap:
            self._selecting[key] = (acc["sel"], False) if acc["sel"] else (gap, True)
        # its stores alone (loads aside) shown to reach every element, as a 'store' kernel's are
        self._sides()[key] = acc["stores"] and not (acc["atomics"] or acc["dd"] or acc["part"] or acc["sel"]
                                                    or gap or early_return or acc["side_bad"])
        self._kernel_summary[key] = res
        return res

    def _program_bounded(self, fn: _Func, loop: ast.For, ptr, pid: set) -> bool:
        """A store in ``for .. in range(.., stop)`` where ``stop`` and the store's address (the loop variable
        aside) both follow the program's position (``pid``: names from program ids, or a helper's parameters
        given them): each row block writes as many columns as its position allows, a triangle or band (a
        causal attention matrix), and the rest keeps what was there. A persistent loop (``range(pid, n, step)``)
        or a loop over each program's own rows (the address follows the loop variable alone) is not one."""
        it = loop.iter
        if not (isinstance(it, ast.Call) and _call_name(it) == "range" and it.args and pid):
            return False
        defs = self._loaded[id(fn.node)][2]
        stop = it.args[0] if len(it.args) == 1 else it.args[1]
        own = _names_in(loop.target)
        stop_on = _depends(stop, defs)[0]
        addr_on = _depends(ptr, {k: v for k, v in defs.items() if k not in own})[0] - own
        return bool(stop_on & addr_on & pid)

    def _sides(self) -> dict:
        return self.__dict__.setdefault("_store_sides", {})

    def stores_whole(self, fn: _Func, param: str, given: frozenset = frozenset()) -> bool:
        """Do ``param``'s plain stores (its loads aside; no atomics) pass the test a 'store' kernel passes
        (no data-dependent address or mask, no selecting mask, no missed part, no early return)? A
        read-modify-write kernel for which they do writes every element it is launched over."""
        self.kernel_use(fn, param, given=given)
        return self._sides().get((id(fn.node), param, given), False)

    def _body(self, fn: _Func) -> list:
        """The kernel's nodes, and (once per kernel) its loaded names, program-id names and assignments."""
        body = self._bodies.get(id(fn.node))
        if body is None:
            body = self._bodies[id(fn.node)] = list(ast.walk(fn.node))
        if id(fn.node) not in self._loaded:
            self._loaded[id(fn.node)] = (_loaded_names(body), _loaded_names(body, "program_id"), _assignments(body))
        return body

    def selecting_note(self, fn: _Func, param: str, given: frozenset = frozenset()) -> str:
        """Why ``param``'s stores are 'store-sel': the mask term that selects (``k >= 0``), or the part
        every store's address misses (:func:`workbook.audit.offsets.store_gap`); '' when they are not."""
        return self._selecting.get((id(fn.node), param, given), ("", False))[0]

    def _gap_only(self, fn: _Func, param: str, given: frozenset = frozenset()) -> bool:
        """Are ``param``'s stores 'store-sel' only because their addresses miss a part (not by a mask)?"""
        return self._selecting.get((id(fn.node), param, given), ("", False))[1]

    def store_sites(self, fn: _Func, param: str) -> list[tuple[set, set, bool]]:
        """Per direct ``tl.store`` through ``param``: the program-id axes its address follows, the names
        the address is computed from, and whether it sits in a loop striding by the number of programs
        (a grid-stride loop covers the rest whatever the grid)."""
        body = self._body(fn)
        taint = _tainted(body, param)
        defs = self._loaded[id(fn.node)][2]
        out = []
        for n in body:
            if isinstance(n, ast.Call) and _call_name(n) == "store" and n.args and _names_in(n.args[0]) & taint:
                names, axes = _depends(n.args[0], defs)
                strided, p = False, fn.parents.get(n)
                while p is not None and p is not fn.node:
                    if isinstance(p, (ast.For, ast.While)) and any(
                            isinstance(c, ast.Call) and _call_name(c) == "num_programs"
                            for c in ast.walk(getattr(p, "iter", None) or p.test)):
                        strided = True
                    p = fn.parents.get(p)
                out.append((axes, names, strided))
        return out

    def autotuned_grid(self, caller: _Func, call: ast.Call, kern: _Func, param: str, use):
        """A launch whose grid sizes an axis by the launch config (``meta["BLOCK_N"]``, not given at the
        launch) while a store through ``param`` writes one element per program on that axis (its address
        does not follow that key, and no grid-stride loop covers the rest): how much is written depends
        on the config the autotuner picks, so the write is not shown whole (low, and said)."""
        given = {k.arg for k in call.keywords}
        axes = {a: keys - given for a, keys in _grid_meta_axes(call.func.slice, caller).items() if keys - given}
        if not axes:
            return use
        for pid_axes, names, strided in self.store_sites(kern, param):
            for a in sorted(pid_axes):
                if a in axes and not strided and not names & axes[a]:
                    key = sorted(axes[a])[0]
                    use.confidence = "low"
                    use.how = use.how[:-1] + (f"; one element per program on grid axis {a}, which the autotuned "
                                              f"meta[{key!r}] sizes: how much it writes depends on the config)")
                    return use
        return use

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
                    acc["sites"] += 1
                    gap = store_gap(fn, ptr, taint) if ptr is not getattr(n.func, "value", None) else None
                    acc["gaps"] += [gap] if gap else []
                    mask = next((k.value for k in n.keywords if k.arg == "mask"), n.args[2] if len(n.args) > 2 else None)
                    used = {x for e in (ptr, mask) if e is not None for x in _names_in(e)}
                    loop = fn.parents.get(n)
                    while loop is not None and loop is not fn.node:
                        if isinstance(loop, (ast.For, ast.While, ast.If)):   # the store runs when a loaded value says
                            used |= _names_in(getattr(loop, "iter", None) or loop.test)
                        if isinstance(loop, ast.If) and _between_programs(loop.test, acc["pid"]) \
                                and not _exhaustive(loop):
                            acc["part"] = True    # if i_i > i_j: ... (no else): some programs store nothing
                        acc["part"] |= isinstance(loop, ast.For) and self._program_bounded(fn, loop, ptr, acc["pid"])
                        loop = fn.parents.get(loop)
                    acc["dd"] |= bool(used & loaded)
                    term = _selecting_term(mask, self._loaded[id(fn.node)][2]) if mask is not None else None
                    if term and not acc["sel"]:
                        acc["sel"] = f"its store mask ({term}) selects among in-bounds elements: those it leaves " \
                                     "out keep what was there"
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
            # the helper's parameters that receive a program's position (its block index): see _program_bounded
            given = frozenset([params[j] for j, a in enumerate(n.args) if j < len(params) and _from_pid(a, acc["pid"])]
                              + [k.arg for k in n.keywords if k.arg and _from_pid(k.value, acc["pid"])])
            for i in hits:
                if i < len(params):
                    u = self.kernel_use(callee, params[i], depth + 1, given)
                    acc["stores"] |= u in ("store", "store-dd", "store-part", "store-sel", "store-early", "rmw", "zeroed")
                    acc["part"] |= u == "store-part"
                    if u in ("store", "store-dd", "store-part", "store-sel", "store-early"):
                        acc["sites"] += 1     # the helper's stores, as one site of ours
                        note = self.selecting_note(callee, params[i], given)
                        by_gap = self._gap_only(callee, params[i], given)
                        acc["gaps"] += [note] if u == "store-sel" and by_gap else []
                        acc["sel"] = acc["sel"] or (note if u == "store-sel" and not by_gap else None)
                    acc["loads"] |= u in ("load", "rmw")
                    acc["side_bad"] |= u in ("rmw", "zeroed") and not self.stores_whole(callee, params[i], given)
                    acc["dd"] |= u == "store-dd"
