"""What the audit knows about a callee from its name and its words alone, when its body is not in the
files (or says less than its documentation): ``out=`` semantics, collectives, DLPack, constructors,
an op's docstring and comments, import aliases and ``torch.compile`` results.

Each answer is ``(kind, how, confidence)`` (or None: nothing known), which
:mod:`workbook.audit.analyzer` turns into a use of the buffer:

* ``out=`` overwrites for torch's and numpy's own functions (``torch.matmul(.., out=r)``); for any
  other callee it is an assumption (medium), low when the call's name or keywords speak of
  accumulating (``accumulate=``, ``beta=``, ``*_add``, ``scatter``, an epilogue); a keyword given to
  a constructor or a field replacement (``Result(out=x)``, ``p.clone(out=x)``, ``replace(..)``) is
  not a write at all: the buffer is stored, and its trail is lost there.
* collectives of ``torch.distributed``: ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
  ``all_to_all_single``, ``recv`` write every element of their output (a whole write); ``all_reduce``
  and ``reduce`` read their buffer (its zeros are an input); any other collective, or one called on
  an object the audit cannot see, loses the trail (low).
* DLPack (``from_dlpack``, ``to_dlpack``, ``__dlpack__``) hands the memory to another name or
  framework: the trail is lost (low).
* metadata only (:func:`_metadata_call`): ``torch.empty_like(x)`` and the other ``*_like``
  constructors with the buffer as their prototype, and ``x.new_empty(..)``/``new_zeros``/``new_ones``/
  ``new_full`` on it, read its shape, dtype and device, no element: no use of the buffer at all.
* an op's own words: a docstring or comment that says it accumulates into the buffer (accumulate,
  add into, sum into, ``+=``, atomic add) or leaves part of it untouched (untouched, unchanged, not
  written, padding left as is) outweighs a write the audit only assumed (``mutates_args``, a callee
  not followed).
"""
from __future__ import annotations

import ast
import re

from .source import _dotted, _src

# callees whose ``out=`` is an overwrite (torch's own functions and numpy's), not custom ops
_LIBRARY = ("torch.", "np.", "numpy.", "F.", "tl.", "triton.", "math.", "_VF.")
_CUSTOM_OPS = ("torch.ops.",)
_ATEN = ("torch.ops.aten.", "torch.ops.prims.")
_DIST = ("dist.", "torch.distributed.", "c10d.", "distributed.")
_COLLECTIVE_WRITE = {"all_gather_into_tensor": ("output_tensor", "output"), "_all_gather_base": ("output_tensor",),
                     "reduce_scatter_tensor": ("output",), "_reduce_scatter_base": ("output",),
                     "all_to_all_single": ("output",), "recv": ("tensor",), "irecv": ("tensor",)}
_COLLECTIVE_REDUCE = {"all_reduce", "reduce", "all_reduce_coalesced"}
_COLLECTIVE_RE = re.compile(r"all_?gather|all_?reduce|reduce_?scatter|all_?to_?all|broadcast|^i?send$|^i?recv$",
                            re.IGNORECASE)
_DLPACK = {"from_dlpack", "to_dlpack", "__dlpack__"}
_LIKE_CTORS = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like"}
_NEW_CTORS = {"new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided"}   # x.new_*(..): x's dtype/device
_FIELD_REPLACE = {"clone", "replace", "_replace", "evolve", "model_copy", "copy_with", "with_", "dict", "partial",
                  "SimpleNamespace", "namedtuple", "update"}
_ACC_CALL = re.compile(r"accum|(^|_)add($|_)|addmm|scatter|reduce|(^|_)sum($|_)|epilogue|residual|axpy",
                       re.IGNORECASE)
_ACC_KW = re.compile(r"accum|^beta$|residual|add_to|inplace|epilogue|scatter|reduce|^c$|^bias_add", re.IGNORECASE)
_ACC_WORDS = re.compile(r"\baccumulat\w*|\badds?\s+(?:\w+\s+){0,3}(?:in)?to\b|\badded\s+(?:in)?to\b|\bsums?\s+into\b|"
                        r"\+=|\batomic(?:ally)?[_ ]?add|\bin[- ]place\s+add|\bscatter[-_ ]add", re.IGNORECASE)
_UNTOUCHED_WORDS = re.compile(r"\buntouched\b|\bleft\s+(?:as\s+is|alone|unchanged|unwritten|intact)|"
                              r"\bnot\s+(?:over)?written\b|\bunchanged\b|\bnever\s+written\b|\bskips?\s+(?:the\s+)?padd",
                              re.IGNORECASE)
_IMPORT_FROM = re.compile(r"^[ \t]*from[ \t]+[.\w]+[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_AS = re.compile(r"\b(\w+)\s+as\s+(\w+)")
_MODULE_ALIAS = re.compile(r"^([A-Za-z_]\w*)[ \t]*=[ \t]*([A-Za-z_]\w*)[ \t]*(?:#.*)?$", re.M)
_COMPILED = re.compile(r"torch\.compile\([ \t]*([\w.]*)")
_ASSIGNED = re.compile(r"(\w+)[ \t]*=[ \t]*$")


def _is_library(dotted: str) -> bool:
    """torch's, numpy's, Triton's own functions (their names are never resolved in the files), but
    not ``torch.ops.<namespace>`` custom ops, which may be defined in the files."""
    if dotted.startswith(_CUSTOM_OPS):
        return dotted.startswith(_ATEN)
    return dotted.startswith(_LIBRARY)


def _metadata_call(call: ast.Call, arg, name: str, kw: str | None) -> bool:
    """Does ``call`` read only the metadata of ``arg`` (``torch.empty_like(arg)``, ``zeros_like(input=arg)``:
    the prototype of a ``*_like`` constructor gives shape, dtype and device, no element)?"""
    if name not in _LIKE_CTORS:
        return False
    if kw is not None:
        return kw == "input"
    return bool(call.args) and call.args[0] is arg


def _is_constructor(call: ast.Call, name: str) -> bool:
    """A class (CamelCase) or a field replacement: keywords become fields, nothing is written."""
    return (name[:1].isupper() and not name.isupper()) or name in _FIELD_REPLACE


def _accumulate_hint(call: ast.Call, name: str) -> str | None:
    """Words in the call that speak of accumulating into the output: its name, or a keyword."""
    if _ACC_CALL.search(name):
        return f"its name '{name}' speaks of accumulating"
    for k in call.keywords:
        if k.arg and _ACC_KW.search(k.arg) and not (isinstance(k.value, ast.Constant) and k.value.value in (None, False, 0)):
            return f"keyword {k.arg}={_src(k.value)} speaks of accumulating"
    return None


def _out_keyword(call: ast.Call, name: str, dotted: str, partial: bool) -> tuple[str, str, str]:
    """``f(..., out=buf)``: a whole write for torch/numpy, stored for a constructor, assumed otherwise."""
    desc = _src(call.func)
    if _is_library(dotted) and not dotted.startswith(("tl.", "triton.")):
        return ("partial" if partial else "write", f"{desc}(..., out=...)", "medium" if partial else "high")
    if _is_constructor(call, name):
        return ("escape", f"stored by {desc}(..., out=...), a constructor or field replacement (not a write): "
                          "its later use is not followed", "low")
    hint = _accumulate_hint(call, name)
    how = f"{desc}(..., out=...) (callee not in the files: out= assumed to overwrite"
    if hint:
        return ("partial" if partial else "write", how + f"; but {hint}, so it may add into out)", "low")
    return ("partial" if partial else "write", how + ")", "low")


def _collective(call: ast.Call, arg, name: str, dotted: str, kw: str | None, partial: bool) -> tuple | None:
    """A collective that receives the buffer: whole write, read, or a trail lost."""
    if not _COLLECTIVE_RE.search(name) and name not in _COLLECTIVE_WRITE:
        return None
    torch_dist = dotted.startswith(_DIST) or dotted == name
    desc = _src(call.func)
    if name in _COLLECTIVE_WRITE:
        is_out = kw in _COLLECTIVE_WRITE[name] if kw else bool(call.args) and call.args[0] is arg
        if is_out:
            conf = "high" if torch_dist else "medium"
            note = "" if torch_dist else " (called on an object: torch.distributed's semantics assumed)"
            return ("partial" if partial else "write", f"collective {desc}(...) writes every element of its "
                    f"output{note}", "medium" if partial else conf)
        return ("read", f"collective {desc}(...) reads its input", "high")
    if name in _COLLECTIVE_REDUCE and torch_dist:
        return ("accumulate", f"collective {desc}(...) reduces the buffer across ranks: its zeros are an input",
                "high")
    return ("escape", f"passed to the collective {desc}(...): what it does with the buffer on each rank is "
                      "not followed", "low")


def _doc_hint(doc: str, comments: list[str], param: str, only_output: bool) -> tuple[str, str] | None:
    """What an op's own words say about ``param``: ('accumulate' | 'partial', the sentence), or None.
    A sentence counts when it names ``param`` (or the op has that one output)."""
    text = " ".join(doc.split())
    sentences = [s for s in re.split(r"(?<=[.;:])\s+", text) if s] + [c.strip() for c in comments if c.strip()]
    word = re.compile(rf"\b{re.escape(param)}\b")
    for s in sentences:
        if not (only_output or word.search(s)):
            continue
        if _ACC_WORDS.search(s):
            return "accumulate", s
        if _UNTOUCHED_WORDS.search(s):
            return "partial", s
    return None


def _import_aliases(text: str) -> dict[str, str]:
    """{alias: original} of ``from m import a as b`` and module-level ``b = a`` in a file's text."""
    out = {}
    for m in _IMPORT_FROM.finditer(text):
        for a in _AS.finditer(m.group(1)):
            out[a.group(2)] = a.group(1)
    for m in _MODULE_ALIAS.finditer(text):
        if m.group(2) not in ("None", "True", "False") and m.group(1) != m.group(2):
            out.setdefault(m.group(1), m.group(2))
    return out


def _compiled_names(text: str) -> dict[str, str]:
    """{name: what it compiles} for ``name = torch.compile(fn)`` (or ``self.name = ...``) in a file."""
    out = {}
    for m in _COMPILED.finditer(text):
        a = _ASSIGNED.search(text, text.rfind("\n", 0, m.start()) + 1, m.start())
        if a:
            out[a.group(1)] = m.group(1)
    return out


# jit decorators of other compilers (numba, numba.cuda, jax): their kernels are launched with the same
# kernel[grid](...) syntax but are not Triton code (a numba kernel reads its arrays by subscript, not tl.load)
_OTHER_JIT = re.compile(r"(^|\.)(cuda|numba|nb|jax|njit)(\.|$)")


def _is_jit(node) -> bool:
    """A Triton kernel: a def decorated with ``triton.jit`` (or ``jit``, ``autotune``, ``heuristics``), not with
    another compiler's jit (``numba.cuda.jit``, ``cuda.jit``, ``numba.jit``, ``jax.jit``)."""
    names = [_dotted(d.func if isinstance(d, ast.Call) else d) or "" for d in getattr(node, "decorator_list", [])]
    if any(_OTHER_JIT.search(n) for n in names):
        return False
    return any(re.search(r"(^|\.)(jit|autotune|heuristics)$", n) for n in names)


def _by_name(call: ast.Call, arg, name: str, dotted: str, kw: str | None, partial: bool, known: bool) -> tuple | None:
    """What the callee's name alone says: DLPack loses the trail; a collective writes, reads or loses it.
    ``known=False``: only what needs no look-up (DLPack, ``dist.*``); ``known=True``: a name the files
    do not define (another object's collective)."""
    if name in _DLPACK:
        return None if known else \
            ("escape", f"{_src(call.func)}(...): the memory goes on under another name (DLPack): not followed", "low")
    if known or dotted.startswith(_DIST):
        return _collective(call, arg, name, dotted, kw, partial)
    return None
