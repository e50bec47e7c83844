"""The analysis of the static audit (:mod:`workbook.audit`), and the rules it follows.

``python -m workbook audit PATH...`` (or ``python -m workbook.audit PATH...``) reads Python sources with
:mod:`ast` and lists **allocate-then-overwrite candidates**: a zero fill (``torch.zeros``,
``zeros_like``, ``new_zeros``, ``full(.., 0)``, ``full_like(.., 0)``, ``new_full(.., 0)``,
``.zero_()``, ``.fill_(0)``, ``t[:] = 0``) whose tensor is, as its next use, overwritten:

* passed to a Triton launch ``kernel[grid](...)`` whose kernel (a ``@triton.jit`` def found in the
  files, under its own name or an import alias) only *stores* through that pointer (a kernel that
  loads or ``atomic_*``s it accumulates: the zeros are needed). ``name[i](...)`` is a launch only when
  ``name`` is such a kernel or unknown; an element of a list/tuple/dict variable, or a constant index
  (``lc[1](...)``), is a call of an unknown callee;
* passed as ``out=`` to torch's or numpy's own functions (overwrite semantics), or as the output of a
  collective that writes every element (``all_gather_into_tensor``, ``reduce_scatter_tensor``,
  ``all_to_all_single``, ``recv``); ``out=`` to any other callee is an assumption, and a keyword to a
  constructor or a field replacement (``Result(out=x)``, ``p.clone(out=x)``) is no write at all;
* assigned whole: ``x[:] = ...``, ``x[...] = ...``, ``x.copy_(...)``, zero-filled again
  (``x.zero_()``: the first fill is the redundant one), or by writes whose slices together cover
  every element (:mod:`workbook.audit.regions`: ``[:k]`` + ``[k:]`` on any one dimension, ``[0]`` +
  ``[1:]``, ``[:, 0]`` + ``[:, 1]`` of a dimension allocated as 2, ``0::2`` + ``1::2``,
  ``[..., :h]`` + ``[..., h:]``; bounds compared as sums after the names assigned once are replaced,
  so ``total = n + m`` ends ``[:n]`` + ``[n:n + m]``; on each ``if q == 4:`` branch separately);
* handed to a Python function or custom op of the files given whose parameter is written that way
  (followed up to a few calls deep, through import aliases; a name defined two or three times is
  followed into each definition, and only an answer they all give counts), or returned from an
  allocation helper whose callers do one of the above.

A zeros buffer whose next use reads it (``+=``, ``index_add_``, ``scatter_add_``, an accumulating
kernel or one whose ``@triton.autotune`` resets it to zero, ``all_reduce``, any arithmetic, a nested
function that reads it, a partial slice write that leaves the rest zero, a returned buffer no caller
in the files overwrites) is **not** reported: the zero fill is part of the result (it is listed as
*necessary*, with the reason). Statements after a ``return``/``raise``/``continue``/``break`` of their
block (or of one ending every path from the fill) never run and are not read. An op's own
words outweigh a write the audit only assumes (:mod:`workbook.audit.callees`): a ``mutates_args``
op, or one whose body is not followed, whose docstring or comments say it accumulates into the
buffer or leaves part of it untouched is taken at its word.

**Where the trail is lost** the tool says so, never silently: a zero fill whose next use is a callee
not in the files (a function, an ``nn.Module``, a ``torch.compile`` result, an element of a list), a
collective other than the ones above, DLPack (``from_dlpack``), a raw ``data_ptr()`` passed on, a
container, an object's field, a nested function that writes it, an attribute kept past the function, or
a position after a ``*starred`` argument whose length the function does not show (a literal tuple, the
strides of a tensor of known ndim: :mod:`workbook.audit.arguments`), is a ``trail-lost`` finding at
``low`` confidence that names the place.

A nested function or lambda that captures the buffer counts as a use where it is defined (after the
fill): one that reads it makes the zeros necessary, one that writes it loses the trail (when it runs
is not followed); a lambda that reads only ``x.shape`` is no use.

It also flags the reverse risk: an ``empty`` buffer written only through slices (``out[:n] = ...``,
``kernel[grid](out[:n])``), once (not in a loop, nor allocated on a loop's first pass, ``if out is None:``,
and written on every pass), when some part of it is neither shown written (the slices do not
provably cover it: :func:`workbook.audit.regions._gap`) nor shown unread: after the writes the buffer
is used beyond the written slices (returned whole, passed on, stored, kept). The finding names that
consumer. Reads of exactly the written slices (``return out[:n]``, or an alias ``y = out[:n]`` of one,
unless the allocation is padded: a view over padded storage may be read beyond its end) and a buffer
that is dropped are proofs that the rest is unread. It is ``medium`` only when every write before the
consumer is an unconditional, straight-line slice write with comparable bounds, a part is provably
outside all of them, and the consumer is not seen; else ``low`` with the reason (a loop, an ``if``, a
size a test picks, a container kept in an attribute, an object's field: :mod:`workbook.audit.certainty`).

Confidence (the rule, so that a maintainer can weigh a finding):

* ``high``: the overwrite is the first use after the fill, in the same or an enclosing block (not only
  under an ``if``/loop/``try`` the fill is not under), and it is a whole-tensor construct
  (``x[:] =``, ``copy_``, torch's ``out=``, a covering set of slices, a whole-output collective) or a
  launch/custom op/function whose body in the files given writes that argument and never reads it.
* ``medium``: shown, not assumed, but short of high: the overwrite goes through an allocation helper's
  callers, or through a name defined more than once, or the fill is one branch of a conditional
  expression (``x = zeros(..) if x is None else x``: the other hands on a buffer not allocated there); a
  reverse risk where a part is proven left unwritten (a missed index or stride start, or the tail
  ``[n, size)`` of a dimension written on ``[0, n)`` and allocated with another size) by straight-line
  writes, and handed to a consumer not seen (not kept in an attribute, a container there, an object's field).
* ``low``: anything that rests on an assumption or may leave zeros: the overwrite is under a
  condition/loop the fill is not under (where it is false the zeros survive); the callee is not in
  the files (``out=`` of another library, a kernel or op whose argument has an output-like name, a
  ``mutates_args`` op whose body shows no write), or something says it may add into it (an
  accumulate keyword, a name such as ``*_add``); a kernel that may return before its stores (an ignored
  row keeps its zero), or whose stores a loaded value decides (an index, a mask, an ``if`` on a loaded
  value) or that stores only for the programs one side of a comparison of program ids picks (a triangle
  of blocks) or in a loop whose trip count and address both follow the program's position (a band),
  under a mask that picks among in-bounds elements (``k >= 0``: a band scatter), at addresses
  that all miss a part (a start past index 0, a diagonal, a program id added to an arange:
  :mod:`workbook.audit.offsets`), or one element per program on a grid axis that an autotuned
  ``meta[...]`` sizes (how many: the config's) (:mod:`workbook.audit.kernel_use`); a reverse risk whose
  writes cannot be modelled (index tensors, views of unknown size, several dimensions, a start not 0) or
  are not certain (in a loop, under a condition): the finding says so; every ``trail-lost`` finding.

Writes through part of a tensor (``x[:n]``, ``narrow``, ``select``, an alias ``y = x[:n]``) are partial;
``if``/``else`` branches are exclusive; other control flow is read in source order. Only the functions
that hold a fill or an ``empty`` (and those the analysis follows) are parsed, one def at a time.
A deliberate case is marked where it is allocated, as linters do: ``# audit: ok -- <why>`` on the
allocation's line (or a comment line just above it) moves the finding to the *suppressed* list with
its reason (:mod:`workbook.audit.sites`); the reason is required.

A finding is a *candidate*, not a proof: its **proof obligation** says which writes must cover which
region (and whether padding, a view over larger storage or a partial slice is involved); prove it
with :mod:`workbook.coverage` (poisoned runs, whole-storage coverage maps, the consumer differential,
``find_redundant_zero_fills``), as notebook 07 does.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field, replace

from .arguments import _position
from .certainty import _kept_in
from .callees import (_by_name, _compiled_names, _doc_hint, _DLPACK, _import_aliases, _is_constructor,
                      _is_jit, _is_library, _metadata_call, _NEW_CTORS, _out_keyword)
from .holders import _holder_nodes, _holder_use
from .kernel_use import _Kernels
from .regions import _alloc_shape, _env, _gap, _pad_reason
from .results import _RANK
from .source import (_Blocks, _call_name, _control, _dotted, _every_path_uses, _exclusive, _exit_after, _Func, _Index,
                     _is_whole_slice, _is_zero, _launched, _mutated_args, _params, _Source, _src, _stmt_of, _unreachable)

# ---- vocabularies ---------------------------------------------------------------------------------
_META = {"shape", "size", "stride", "dtype", "device", "numel", "dim", "ndim", "data_ptr", "is_contiguous",
         "element_size", "storage_offset", "nbytes", "itemsize", "is_cuda", "layout", "requires_grad",
         "untyped_storage", "get_device", "nelement", "ndimension", "is_floating_point"}
_VIEWS = {"view", "reshape", "T", "mT", "t", "transpose", "permute", "as_strided", "narrow", "flatten", "unflatten",
          "unsqueeze", "squeeze", "view_as", "reshape_as", "expand", "select", "unbind", "split", "chunk",
          "movedim", "swapaxes", "diagonal", "real", "imag", "data", "detach"}
_PART_VIEWS = {"narrow", "select", "split", "chunk", "unbind", "diagonal",   # views of a part of the tensor
               "as_strided"}   # sizes and strides of the caller's choosing: a band, a window (not all, in general)
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
_STATE_CALLS = {"register_buffer", "register_parameter", "Parameter", "Buffer"}   # the zeros become module state
_OUTPUT_NAME = re.compile(r"(^|_)(out|outs|output|outputs|dst|dest|result|results|res|o|y|c)(_|\d|$)|out$|^out",
                          re.IGNORECASE)
_CONTAINERS = (ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_MAX_DEPTH = 4
_MAX_DEFS = 3          # a name defined more often than this is not followed (which one runs is unknown)


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
    region: ast.AST | None = None      # the slice this occurrence goes through (x[sl]), if any
    regions: list = field(default_factory=list)   # the slices of the partial writes, in order
    consumer: str | None = None        # after partial writes: who uses the buffer beyond them
    consumer_line: int | None = None   # and where (None: kept past the function)


def _min_conf(a: str, b: str) -> str:
    return a if _RANK[a] <= _RANK[b] else b


def _combine(uses: list[tuple[str, "_Use"]], desc: str) -> "_Use":
    """One answer from several definitions of a callee's name: the one they all give (medium at most),
    else the trail is lost."""
    kinds = {u.kind for _, u in uses}
    first = uses[0][1]
    where = ", ".join(w for w, _ in uses)
    if len(kinds) == 1:
        conf = "medium"
        for _, u in uses:
            conf = _min_conf(conf, u.confidence)
        return _Use(first.kind, first.line, f"{first.how} (the name has {len(uses)} definitions, {where}: all agree)",
                    conf, view=first.view)
    said = "; ".join(f"{w}: {u.kind}" for w, u in uses)
    return _Use("escape", first.line, f"{desc}(...) has {len(uses)} definitions in the files that disagree ({said})",
                "low")


# ---- the project: the index, plus what the analysis learns about its functions -------------------

class _Project(_Kernels, _Index):
    """The files given (:class:`~workbook.audit.source._Index`), with cached summaries: how a Triton
    kernel uses a pointer parameter (:meth:`kernel_use`), what a Python function does first with a
    parameter (:meth:`param_use`), which defs a name may mean in a file (:meth:`resolve_all`, import
    aliases included), and the nested functions of a function (:meth:`closures`). It also holds what
    the sites record across functions: the sites already analyzed (a nested def is loaded with its
    enclosing def and alone) and the suppressed findings."""

    def __init__(self, sources: dict[str, _Source], skipped: list):
        super().__init__(sources, skipped)
        self._kernel_summary: dict[tuple[int, str], str] = {}   # (kernel_use.py)
        self._bodies: dict[int, list] = {}
        self._loaded: dict[int, tuple] = {}      # kernel -> (loaded names, program-id names, assignments)
        self._selecting: dict[tuple[int, str], tuple] = {}   # (kernel, param) -> (why a part, by addresses?)
        self._param_summary: dict[tuple[int, str], tuple] = {}
        self._aliases: dict[str, dict] = {}
        self._compiled: dict[str, dict] = {}
        self._resolved_all: dict[tuple[str, str], tuple] = {}
        self._closures: dict[int, list] = {}
        self.by_node: dict[int, _Func] = {}
        self.sites_done: set[tuple] = set()
        self.suppressed: list[dict] = []

    def load(self, *args, **kwargs) -> list[_Func]:
        funcs = super().load(*args, **kwargs)
        for f in funcs:
            self.by_node.setdefault(id(f.node), f)
        return funcs

    def aliases(self, file: str) -> dict[str, str]:
        if file not in self._aliases:
            src = self.sources.get(file)
            self._aliases[file] = _import_aliases(src.text) if src is not None else {}
        return self._aliases[file]

    def compiled(self, file: str) -> dict[str, str]:
        if file not in self._compiled:
            src = self.sources.get(file)
            self._compiled[file] = _compiled_names(src.text) if src is not None and "torch.compile" in src.text else {}
        return self._compiled[file]

    def resolve_all(self, name: str, file: str) -> tuple[list[_Func], int]:
        """The defs ``name`` may mean in ``file``: through an import alias; the one def of the file if
        there is one; else every def of that name when there are at most ``_MAX_DEFS``. Returns them
        and how many defs the name has in the files."""
        key = (file, name)
        if key not in self._resolved_all:
            self._resolved_all[key] = ([], 0)
            own = any(d[0] == file for d in self.index.get(name, []))
            orig = name if own else self.aliases(file).get(name, name)
            defs = self.index.get(orig, [])
            same = [d for d in defs if d[0] == file]
            pick = same if len(same) == 1 else defs if len(defs) <= _MAX_DEFS else []
            funcs = []
            for f, ln, ind in pick:
                funcs += [x for x in self.load(f, ln, ind) if x.node.name == orig and x.node.lineno - 1 == ln]
            self._resolved_all[key] = (funcs, len(defs))
        return self._resolved_all[key]

    def closures(self, fn: _Func) -> list[tuple[ast.AST, set, set]]:
        """The defs and lambdas directly inside ``fn``: (node, the names they use, the names they assign)."""
        if id(fn.node) not in self._closures:
            out = []
            src = self.sources.get(fn.file)
            body = src.lines[fn.node.lineno: fn.node.end_lineno] if src is not None else ["lambda"]
            nodes = ast.walk(fn.node) if any("lambda" in ln or "def " in ln for ln in body) else ()
            for n in nodes:
                if n is fn.node or not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    continue
                p = fn.parents.get(n)
                while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    p = fn.parents.get(p)
                if p is not fn.node:
                    continue
                used = {d for x in ast.walk(n) if isinstance(x, (ast.Name, ast.Attribute)) for d in [_dotted(x)] if d}
                free = {x for s in ast.walk(n) if isinstance(s, (ast.Nonlocal, ast.Global)) for x in s.names}
                stored = {x.id for x in ast.walk(n) if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Store)}
                stored |= set(_params(n))
                out.append((n, used, stored - free))
            self._closures[id(fn.node)] = out
        return self._closures[id(fn.node)]

    # -- Python functions: what does fn do first with its parameter p?
    def param_use(self, fn: _Func, param: str, depth: int) -> "_Use":
        key = (id(fn.node), param)
        if key in self._param_summary:
            return self._param_summary[key]
        self._param_summary[key] = _Use("escape", fn.node.lineno, f"{fn.qualname} (recursive)", "low")
        mutated = _mutated_args(fn.node)
        use = _Analyzer(self, fn, depth + 1).first_use(param, start=None, origin_node=None)
        assumed = use.kind == "write" and use.confidence != "high"
        if mutated is not None and param in mutated and use.kind in ("escape", "none"):
            use = _Use("write", fn.node.lineno, f"custom op {fn.qualname} (mutates_args={param!r}: declared "
                       "mutated; the body does not show how)", "low")
            assumed = True
        if assumed:
            use = self._own_words(fn, param, mutated) or use
        self._param_summary[key] = use
        return use

    def _own_words(self, fn: _Func, param: str, mutated: set | None) -> "_Use | None":
        """What the function's docstring and comments say it does to ``param``, when that outweighs an
        assumed write (accumulates into it, or leaves part of it untouched)."""
        src = self.sources.get(fn.file)
        lines = src.lines[fn.node.lineno - 1: fn.node.end_lineno] if src is not None else []
        comments = [ln.split("#", 1)[1] for ln in lines if "#" in ln]
        outputs = [p for p in _params(fn.node) if _OUTPUT_NAME.search(p)]
        only = (mutated is not None and mutated == {param}) or outputs == [param]
        hint = _doc_hint(ast.get_docstring(fn.node) or "", comments, param, only)
        if hint is None:
            return None
        kind, sentence = hint
        what = "accumulates into" if kind == "accumulate" else "leaves part of"
        return _Use(kind, fn.node.lineno, f"{fn.qualname} {what} '{param}' by its own words: \"{sentence[:120]}\"",
                    "medium", view=kind == "partial")


_USE_RANK = {"accumulate": 0, "read": 1, "escape": 2, "return": 3, "partial": 4, "write": 5, "rebind": 6}


class _Analyzer:
    """Follows one buffer (a Name or dotted attribute) through a function body in source order."""

    def __init__(self, project: _Project, fn: _Func, depth: int = 0):
        self.p, self.fn, self.depth = project, fn, depth
        self.parents = fn.parents
        self._dead: dict[int, bool] = {}
        self._holders: set[int] = set()     # occurrences of an object that holds the buffer (model of model.w)

    def _occurrences(self, keys: set[str]):
        out = []
        for k in keys:
            out.extend(self.fn.names.get(k, ()))
            held = _holder_nodes(self.fn.names, self.parents, k)   # model.run(x) may read model.w
            self._holders.update(map(id, held))
            out.extend(held)
        return out

    def unreachable(self, st) -> bool:
        """Does statement ``st`` follow a return/raise/continue/break of its block (it never runs)?"""
        if id(st) not in self._dead:
            if self.fn.blocks is None:          # once per function, whatever the number of buffers
                self.fn.blocks = _Blocks()
            self._dead[id(st)] = _unreachable(st, self.parents, self.fn.node, self.fn.blocks)
        return self._dead[id(st)]

    def first_use(self, key: str, start: ast.AST | None, origin_node: ast.AST | None, alloc=None) -> _Use:
        """The first decisive use of ``key`` after statement ``start`` (None: the function start);
        ``origin_node`` is the allocation statement (its shape decides whether slices cover it), or
        ``alloc`` the allocation call in it (a branch of ``a if c else b``, an element of ``a, b = ...``)."""
        keys = {key}
        origin_ctrl = _control(start, self.parents) if start is not None else []
        # a loop that allocates on its first pass only (``if buf is None:``, ``if i == 0:``): the writes
        # it repeats fill the buffer slice by slice, as writes in a loop do
        once_per_loop = {id(c) for k, c in enumerate(origin_ctrl)
                         if isinstance(c, _LOOPS) and any(_first_pass(d, key, c) for d in origin_ctrl[k + 1:])}
        shape = _alloc_shape(alloc if alloc is not None else getattr(origin_node, "value", None))
        closure = self._closure_use(key, start)
        partials: list[_Use] = []
        held = None   # a call on an object that holds the buffer (model.run(x) for model.w): it may read it
        sliced: set[str] = set()   # aliases that are views of a part of the buffer
        view_seen = False
        by_stmt, order = self._statements_after(keys, start)
        i = 0
        while i < len(order):
            st = order[i]
            i += 1
            if closure is not None and (st.lineno, st.col_offset) > closure[0]:
                break                                   # the nested function that captured it comes first
            if self.unreachable(st):
                continue
            roles = self._roles(by_stmt[id(st)], key, sliced)
            # an alias (y = x.view(...), or x = x.view(...)) keeps following the same storage
            for r in [r for r in roles if r.kind == "alias"]:
                if r.partial_writes and r.region is not None and shape and not any(map(_pad_reason, shape)) \
                        and _src(r.region) in {_src(p.region) for p in partials if p.region is not None}:
                    continue   # y = x[sl] of a written slice of an unpadded buffer: y's uses read only that part
                view_seen = view_seen or r.view
                if r.partial_writes:
                    sliced.add(r.how)
                if r.how not in keys:
                    keys.add(r.how)
                    self._queue_alias(r.how, st, order, i, by_stmt)
            held = held or next((r for r in roles if r.kind == "holder"), None)
            roles = [r for r in roles if r.kind not in ("alias", "holder")]
            if not roles:
                continue
            r = min(roles, key=lambda r: _USE_RANK.get(r.kind, 9))
            ctrl = _control(st, self.parents)
            r.conditional = r.conditional or len(ctrl) > len(origin_ctrl) or \
                any(a is not b for a, b in zip(ctrl, origin_ctrl))   # or under a callee's own if
            r.in_loop = any(isinstance(c, _LOOPS) and (c not in origin_ctrl or id(c) in once_per_loop) for c in ctrl)
            r.view = r.view or view_seen
            done = self._decide(r, st, partials, shape)
            if done is not None:   # an overwrite after such a call: the zeros may have been read (low)
                return replace(held, kind="escape") if held is not None and done.kind == "write" and \
                    not done.how.endswith("zero-fills it again") else done   # a fill again: a reset (necessary)
        return self._end(start, keys, partials, closure)

    def _decide(self, r: _Use, st, partials: list, shape) -> _Use | None:
        """What the use ``r`` makes of the buffer, given the partial writes before it (None: go on)."""
        if r.kind == "rebind":   # the buffer is dropped: after partial writes, the rest was never read here
            return self._partial(partials, None) if partials else \
                _Use("none", st.lineno, "the name is rebound before any use", "low")
        if r.kind == "partial":
            partials.append(r)
            if all(p.region is not None for p in partials) and \
                    _gap([p.region for p in partials], shape, None, _env(self.fn.stmts, self.fn.names, self.fn.consts))[0] is None:
                whole = all(p.how.endswith("= ...") for p in partials)
                conf = "high" if whole else "medium"
                return _Use("write", st.lineno, "slices " + " and ".join(p.how for p in partials) + " cover it", conf,
                            view=any(p.view for p in partials), partial_writes=[p.how for p in partials],
                            regions=[p.region for p in partials], conditional=any(p.conditional for p in partials))
            return None
        if not partials:
            return r
        if r.kind == "write" and r.region is None:
            return r                                         # a whole write after the partial ones
        written = {_src(p.region) for p in partials if p.region is not None}
        if r.region is not None and _src(r.region) in written:
            return None                                      # reads exactly a written slice: the rest stays unread
        return self._partial(partials, r)

    def _partial(self, partials: list, consumer: _Use | None) -> _Use:
        """The buffer was written in part (``partials``), then used beyond them by ``consumer``."""
        who = None
        if consumer is not None:
            if consumer.kind == "return":
                who = (f"returned whole to the callers of {self.fn.qualname}() (line {consumer.line}): a consumer "
                       "this function cannot see")
            else:
                verb = {"read": "read by ", "accumulate": "added into by ", "write": "written by "}.get(consumer.kind, "")
                who = f"{verb}{consumer.how} (line {consumer.line})"
        return _Use("partial", partials[0].line, ", ".join(p.how for p in partials),
                    partial_writes=[p.how for p in partials], regions=[p.region for p in partials],
                    view=any(p.view for p in partials), conditional=partials[0].conditional,
                    in_loop=any(p.in_loop for p in partials), consumer=who,
                    consumer_line=consumer.line if consumer is not None else None)

    def _end(self, start, keys: set[str], partials: list, closure) -> _Use:
        """No decisive use in the body: a nested function that captured it, an attribute kept past the
        function, or nothing."""
        kept = sorted(k for k in keys if "." in k)
        line = start.lineno if start is not None else self.fn.node.lineno
        if closure is not None:
            return self._partial(partials, closure[1]) if partials else closure[1]
        if partials:
            u = self._partial(partials, None)
            if kept:
                u.consumer = f"kept in {kept[0]} beyond this function: its readers are not followed"
            return u
        if kept:
            return _Use("escape", line, f"kept in {kept[0]} beyond this function: its later readers are not followed",
                        "low")
        return _Use("none", line, "no later use in this function", "low")

    def _closure_use(self, key: str, start) -> tuple[tuple, _Use] | None:
        """A nested def or lambda of this function that captures the buffer: where it counts as a use
        (its definition, or the fill if it is defined before) and what it does, or None."""
        best = None
        for node, used, stored in self.p.closures(self.fn):
            if key not in used or key.split(".")[0] in stored:
                continue
            u = self._closure_role(node, key)
            if u is None:
                continue
            stmt = node if not isinstance(node, ast.Lambda) else _stmt_of(node, self.parents)
            if start is not None and _exclusive(start, stmt, self.parents):
                continue                                # defined in the other branch of an if/else
            pos = (stmt.lineno, stmt.col_offset)
            if start is not None:
                pos = max(pos, (start.end_lineno, start.end_col_offset))
            if best is None or pos < best[0]:
                best = (pos, u)
        return best

    def _closure_role(self, node, key: str) -> _Use | None:
        line = node.lineno
        if isinstance(node, ast.Lambda):
            occ = [x for x in ast.walk(node.body) if isinstance(x, (ast.Name, ast.Attribute)) and _dotted(x) == key]
            if all(self._role(x, key).kind == "meta" for x in occ):
                return None
            return _Use("escape", line, f"captured by a lambda (line {line}): its calls are not followed", "low")
        what = f"captured by the nested function {node.name}() (line {line})"
        inner = self.p.by_node.get(id(node))
        if inner is None or self.depth >= _MAX_DEPTH:
            return _Use("escape", line, f"{what}: not followed", "low")
        u = _Analyzer(self.p, inner, self.depth + 1).first_use(key, None, None)
        if u.kind == "none":
            return None
        if u.kind in ("read", "accumulate", "partial"):
            return _Use(u.kind, line, f"{what}, which uses it whenever it is called: {u.how}")
        return _Use("escape", line, f"{what}, which does '{u.kind}' to it ({u.how}): when it runs is not followed",
                    "low")

    def _statements_after(self, keys: set[str], start: ast.AST | None) -> tuple[dict[int, list], list]:
        """The statements after ``start`` that use the buffer, in source order, and the buffer's
        occurrences in each (``{id(statement): [nodes]}``); the other branch of an if/else is left out."""
        start_pos = (start.end_lineno, start.end_col_offset) if start is not None else (0, 0)
        if self.fn.blocks is None:
            self.fn.blocks = _Blocks()
        end = _exit_after(start, self.parents, self.fn.node, self.fn.blocks) if start is not None else None
        end_pos = (end.end_lineno, end.end_col_offset) if end is not None else (1 << 30, 0)
        occ = sorted(self._occurrences(keys), key=lambda n: (n.lineno, n.col_offset))
        by_stmt: dict[int, list] = {}
        order = []
        for n in occ:
            if (n.lineno, n.col_offset) < start_pos or (n.lineno, n.col_offset) > end_pos:
                continue   # before the fill, or past the return/raise that ends every path from it
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
        a write through an alias of a slice is a partial write. Each role keeps the slice it goes
        through (``x[sl]``), so that complementary writes and reads of a written slice can be told."""
        roles = []
        for n in nodes:
            r0 = _Use("holder", *_holder_use(n, key, self.parents), "low") if id(n) in self._holders \
                else self._role(n, key)                # model.run(x) for model.w: not followed
            par = self.parents.get(n)
            if isinstance(par, ast.Subscript) and par.value is n:
                gp = self.parents.get(par)
                if not (isinstance(gp, ast.Subscript) and gp.value is par):
                    r0.region = par.slice
            place = r0.kind == "escape" and _kept_in(n, self.parents, self.fn)
            if place:                                        # in a container that outlives the function
                r0 = replace(r0, how=f"kept in {place} beyond this function ({r0.how}): its readers are not followed")
            if _dotted(n) in sliced and r0.kind == "write":   # written through an alias of a slice
                r0 = _Use("partial", r0.line, f"{r0.how} (through {_dotted(n)}, a slice of {key})", "medium",
                          view=True)
            roles.append(r0)
        return [r for r in roles if r.kind != "meta"]

    # -- the role of one occurrence of the buffer
    def _role(self, node, key) -> _Use:
        par = self.parents.get(node)
        line = node.lineno
        if isinstance(par, ast.Attribute) and par.value is node:   # x.attr / x.method(...)
            return self._role_of_attr(par, key, line)
        if isinstance(par, ast.Subscript) and par.value is node:   # x[...]
            whole = _is_whole_slice(par.slice)
            if isinstance(par.ctx, ast.Store):
                stmt = _stmt_of(par, self.parents)
                if isinstance(stmt, ast.AugAssign):
                    return _Use("accumulate", line, f"{_src(par)} {_src_op(stmt.op)}= ...")
                value = getattr(stmt, "value", None)
                if value is not None and any(_dotted(n) == key for n in ast.walk(value)):
                    return _Use("accumulate", line, f"{_src(par)} = ... {key} ...")
                if value is not None and _is_zero(value) and whole:
                    return _Use("write", line, f"{_src(par)} = 0 zero-fills it again", "high")
                if whole:
                    return _Use("write", line, f"{_src(par)} = ...", "high")
                return _Use("partial", line, f"{_src(par)} = ...", "medium")
            return self._role_of_value(par, key, line, view=True, partial=not whole)
        return self._role_of_value(node, key, line, view=False, partial=False)

    def _role_of_attr(self, par: ast.Attribute, key, line) -> _Use:
        """``x.attr`` or ``x.method(...)``."""
        attr = par.attr
        gp = self.parents.get(par)
        called = isinstance(gp, ast.Call) and gp.func is par
        if attr in _DLPACK:
            return _Use("escape", line, f"{key}.{attr}(): the memory goes on under another name (DLPack): not "
                                        "followed", "low")
        if attr == "data_ptr" and called:
            user = self.parents.get(gp)
            while isinstance(user, (ast.keyword, ast.List, ast.Tuple, ast.Starred, ast.BinOp)):
                user = self.parents.get(user)        # f(x.data_ptr()), f(ptrs=[x.data_ptr(), ...])
            if isinstance(user, ast.Call) and gp is not user.func and _call_name(user) not in _READ_ONLY_CALLS:
                return _Use("escape", line, f"its raw address {key}.data_ptr() is passed to {_src(user.func)}(...): "
                                            "not followed", "low")
        if attr in _META or (called and attr in _NEW_CTORS):     # x.shape, x.new_empty(..): no element read
            return _Use("meta", line, attr)
        if called:
            if attr in ("zero_",) or (attr == "fill_" and gp.args and _is_zero(gp.args[0])):
                # zero-filled again: a whole write of this fill (the new fill is judged as its own site)
                return _Use("write", line, f"{key}.{attr}({'0' if gp.args else ''}) zero-fills it again", "high")
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
                return self._role_of_value(gp, key, line, view=True, partial=attr in _PART_VIEWS)
            return _Use("read", line, f"{key}.{attr}(...)")
        if attr in _VIEWS:
            return self._role_of_value(par, key, line, view=True, partial=False)
        return _Use("read", line, f"{key}.{attr}")

    def _role_of_value(self, expr, key, line, view: bool, partial: bool) -> _Use:
        """The role of an expression that *is* the buffer (or a view of it)."""
        par = self.parents.get(expr)
        # a further view/method on the view
        if isinstance(par, ast.Attribute) and par.value is expr:
            gp = self.parents.get(par)
            if par.attr in _META or (isinstance(gp, ast.Call) and gp.func is par and par.attr in _NEW_CTORS):
                return _Use("meta", line, par.attr)
            if par.attr in _VIEWS:
                return self._role_of_value(gp if isinstance(gp, ast.Call) and gp.func is par else par, key, line, True,
                                           partial or par.attr in _PART_VIEWS)
            if isinstance(gp, ast.Call) and gp.func is par:
                if par.attr in _WHOLE or par.attr in ("fill_", "zero_"):
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
                if par.arg is None:
                    return _Use("escape", line, f"**{key} in {_src(call)}", "low")
                return self._role_in_call(call, expr, key, line, view, partial, kw=par.arg)
        return self._role_in_statement(par, expr, key, line, view, partial)

    def _role_in_statement(self, par, expr, key, line, view, partial) -> _Use:
        """The buffer (or a view of it) assigned, returned, stored, placed in a container."""
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
            idx = next(i for i, e in enumerate(par.elts) if e is expr)
            return _Use("return", line, f"return {_src(par)}", view=view, return_index=idx)
        if isinstance(expr, (ast.Name, ast.Attribute)) and isinstance(expr.ctx, ast.Store):
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
        if isinstance(call.func, ast.Subscript):
            if self._is_launch(call.func):                 # kernel[grid](...): a Triton launch
                return self._role_in_launch(call, arg, key, line, view, partial, kw, name)
            return _Use("escape", line, f"passed to {desc}(...), not a Triton launch (a container's element, or a "
                                        "kernel of another compiler such as numba.cuda): the callee is not followed", "low")
        if name in _READ_ONLY_CALLS or name.startswith("assert") or _metadata_call(call, arg, name, kw):
            return _Use("meta", line, name)
        dotted = _dotted(call.func) or ""
        said = _by_name(call, arg, name, dotted, kw, partial, known=False)   # DLPack; torch.distributed's collectives
        if said is None and not _is_library(dotted):
            u = self._role_in_function(call, arg, line, view, partial, kw, name, desc)
            if u is not None:
                return u
            said = _by_name(call, arg, name, dotted, kw, partial, known=True)   # a collective not in the files
        if said is not None:
            return _Use(said[0], line, said[1], said[2], view=view)
        if kw == "out":
            kind, how, conf = _out_keyword(call, name, dotted, partial)
            return _Use(kind, line, how, conf, view=view)
        if kw and _is_constructor(call, name):
            return _Use("escape", line, f"stored by {desc}(..., {kw}=...), a constructor or field replacement "
                                        "(not a write): its later use is not followed", "low")
        return self._role_unknown_callee(call, arg, key, line, view, partial, kw, name, dotted, desc)

    def _role_unknown_callee(self, call, arg, key, line, view, partial, kw, name, dotted, desc) -> _Use:
        """A callee the files do not define: a custom op or an output-named argument is assumed
        written; torch's own functions read; anything else loses the trail (low)."""
        if dotted.startswith(("torch.ops.", "ops.")) or "._C." in dotted or dotted.startswith("_C") \
                or "custom_ops" in dotted:
            argname = kw or (_dotted(arg) or key)
            first = bool(call.args) and call.args[0] is arg
            outish = bool(_OUTPUT_NAME.search(argname.rsplit(".", 1)[-1]))
            if outish or first:
                return _Use("partial" if partial else "write", line,
                            f"custom op {dotted}(...) (not in the files: '{argname}' assumed to be its output)",
                            "low", view=view)
        if kw and _OUTPUT_NAME.search(kw):
            return _Use("partial" if partial else "write", line,
                        f"{desc}(..., {kw}={_src(arg)}) (callee not in the files: '{kw}' assumed to be an output)",
                        "low", view=view)
        if name in _STATE_CALLS:
            return _Use("read", line, f"kept as module state by {desc}(...): its contents are its initial value")
        if _is_library(dotted) or dotted == "torch":
            return _Use("read", line, f"{desc}(...)")
        compiled = self.p.compiled(self.fn.file).get(name)
        if compiled is not None:
            return _Use("escape", line, f"passed positionally to {desc}(...), a torch.compile'd callable (of "
                                        f"{compiled or 'a module'}): what the compiled graph does with it is not followed",
                        "low")
        ndefs = self.p.resolve_all(name, self.fn.file)[1]
        why = f"the name has {ndefs} definitions in the files: which one runs is not known" if ndefs > _MAX_DEFS \
            else "the callee (a function, an nn.Module, a compiled callable) is not in the files"
        return _Use("escape", line, f"passed to {desc}(...): {why}", "low")

    def _is_launch(self, sub: ast.Subscript) -> bool:
        """``name[grid]``: a Triton launch when ``name`` is a ``@triton.jit`` def of the files (or unknown),
        not when it is an element of a list/tuple/dict variable or indexed by a constant."""
        d = _dotted(_launched(sub.value))
        if d is None or isinstance(sub.slice, ast.Constant):
            return False
        funcs = self.p.resolve_all(d.rsplit(".", 1)[-1], self.fn.file)[0]
        if funcs:
            return any(_is_jit(f.node) for f in funcs)
        for n in self.fn.names.get(d, ()):
            st = self.parents.get(n)
            if isinstance(getattr(n, "ctx", None), ast.Store) and isinstance(st, (ast.Assign, ast.AnnAssign)):
                v = st.value
                if isinstance(v, _CONTAINERS) or isinstance(v, ast.Call) and _call_name(v) in ("list", "tuple", "dict"):
                    return False
        return True

    def _role_in_launch(self, call: ast.Call, arg, key, line, view, partial, kw, name) -> _Use:
        """``kernel[grid](..., arg, ...)``: what the kernel (if it is in the files) does with that pointer."""
        desc = f"{_dotted(_launched(call.func.value)) or name}[grid]"
        idx, lost = _position(call, arg, self.fn) if kw is None else (None, None)
        if lost is not None:          # after a *starred argument of unknown length: no parameter is known
            return _Use("escape", line, f"passed to {desc}(...): {lost}", "low", view=view)
        uses = []
        for kern in [k for k in self.p.resolve_all(name, self.fn.file)[0] if _is_jit(k.node)]:
            param = kw
            if param is None:
                params = _params(kern.node)
                param = params[idx] if idx is not None and idx < len(params) else None
            if param is not None:
                u = self._kernel_role(kern, param, desc, name, line, view, partial)
                if u.kind == "write" and u.confidence != "low":
                    u = self.p.autotuned_grid(self.fn, call, kern, param, u)
                uses.append((f"{kern.file}:{kern.node.lineno}", u))
        if len(uses) == 1:
            return uses[0][1]
        if uses:
            return _combine(uses, desc)
        argname = kw or (_dotted(arg) or key)
        return _Use("partial" if partial else "write", line,
                    f"Triton launch {desc}(...) (kernel not in the files: assumed to write '{argname}')",
                    "low", view=view)

    def _kernel_role(self, kern: _Func, param: str, desc, name, line, view, partial) -> _Use:
        u = self.p.kernel_use(kern, param)
        where = f"{kern.file}:{kern.node.lineno}"
        if u == "zeroed":
            return _Use("accumulate", line, f"Triton launch {name}: its @triton.autotune resets param '{param}' to "
                                            f"zero (reset_to_zero, {where}): the kernel relies on finding it zeroed")
        if u in ("store", "store-dd", "store-part", "store-sel", "store-early"):
            conf = {"store": "high", "store-early": "low", "store-dd": "low", "store-part": "low", "store-sel": "low"}[u]
            note = {"store": "", "store-early": "; it may return early",
                    "store-dd": "; WHICH elements depends on loaded values: those it skips keep what was there",
                    "store-part": "; only the programs one side of a comparison of program ids picks store, or "
                                  "each stores as far as its position allows (a triangle of blocks?): the rest "
                                  "keeps what was there",
                    "store-sel": f"; {self.p.selecting_note(kern, param)}"}[u]
            return _Use("partial" if partial else "write", line,
                        f"Triton launch {desc}(...) writes param '{param}' ({where}: stores only{note})",
                        _min_conf(conf, "medium" if partial else "high"), view=view)
        if u == "rmw":
            return _Use("accumulate", line, f"Triton launch {name}: param '{param}' is loaded and stored / atomics ({where})")
        if u == "load":
            return _Use("read", line, f"Triton launch {name}: param '{param}' is only loaded ({where})")
        return _Use("escape", line, f"Triton launch {name}: param '{param}' unused ({where})", "low")

    def _role_in_function(self, call: ast.Call, arg, line, view, partial, kw, name, desc) -> _Use | None:
        """A call of a Python function (or custom op) of the files given: what it does first with the
        parameter that receives ``arg`` (followed up to ``_MAX_DEPTH`` calls deep, into each of up to
        ``_MAX_DEFS`` definitions of the name; through ``torch.compile``); None when the callee is not
        there (or not followed) or no parameter receives it."""
        if self.depth >= _MAX_DEPTH:
            return None
        compiled = self.p.compiled(self.fn.file).get(name)
        target = compiled.rsplit(".", 1)[-1] if compiled else name
        uses = []
        for fn in self.p.resolve_all(target, self.fn.file)[0]:
            if fn.node is not self.fn.node:
                u = self._one_function(fn, call, arg, line, view, partial, kw, desc)
                if u is not None:
                    uses.append((f"{fn.file}:{fn.node.lineno}", u))
        if not uses:
            return None
        return uses[0][1] if len(uses) == 1 else _combine(uses, desc)

    def _one_function(self, fn: _Func, call, arg, line, view, partial, kw, desc) -> _Use | None:
        params = _params(fn.node)
        skip = 1 if params and params[0] in ("self", "cls") and (fn.is_method or isinstance(call.func, ast.Attribute)) else 0
        param = kw
        if param is None:
            idx, lost = _position(call, arg, self.fn)
            if lost is not None:
                return _Use("escape", line, f"passed to {desc}(...): {lost}", "low", view=view)
            if idx is None:
                return None
            idx += skip
            param = params[idx] if idx < len(params) else None
        if param is None or param not in params:
            return None
        u = self.p.param_use(fn, param, self.depth)
        where = f"{fn.file}:{u.line or fn.node.lineno}"
        if u.kind == "write":
            return _Use("partial" if partial else "write", line,
                        f"{desc}(...) -> {u.how} [{where}]", _min_conf(u.confidence, "medium" if partial else "high"),
                        view=view or u.view, conditional=u.conditional and not _every_path_uses(fn, param, u.line))
        if u.kind in ("accumulate", "read"):
            return _Use(u.kind, line, f"{desc}(...) -> {u.how} [{where}]")
        if u.kind == "partial":
            return _Use("partial", line, f"{desc}(...) -> {u.how} [{where}]", "medium", view=True)
        return _Use("escape", line, f"{desc}(...) [{where}]: {u.how}", "low")


def _first_pass(test_node, key: str, loop) -> bool:
    """Is ``test_node`` an ``if`` that holds only on a loop's first pass: a test of the buffer itself or
    of a name its body assigns (``if buf is None:``, ``if cos is None: cos = ...; sin = ...``), or of
    the loop's index against 0 (``i == 0``)?"""
    if not isinstance(test_node, ast.If):
        return False
    t = test_node.test
    assigned = {_dotted(n) for st in test_node.body for n in ast.walk(st)
                if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Store)} | {key}
    if any(_dotted(n) in assigned for n in ast.walk(t) if isinstance(n, (ast.Name, ast.Attribute))):
        return True
    index = {x.id for x in ast.walk(getattr(loop, "target", ast.Tuple([], ast.Store()))) if isinstance(x, ast.Name)}
    return isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id in index \
        and isinstance(t.ops[0], ast.Eq) and _is_zero(t.comparators[0])


def _src_op(op) -> str:
    return {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.BitOr: "|", ast.BitAnd: "&"}.get(type(op), "?")
