"""The coverage toolkit: proving that ``torch.empty`` is safe, by poisoning.

A fresh allocation often *is* all zeros and a CUDA-graph buffer holds the previous step's bytes, so a
kernel that forgets to write something can pass every test by luck. The cure is to fill the memory
with something no correct kernel would produce (poison), run, and look at what is still poison:

* :func:`poison_` fills the **whole underlying storage** of a tensor, bytes outside its view included.
* :func:`poisoned_allocations` makes ``torch.empty`` & co. return poisoned memory, so launchers that
  allocate their own outputs can be checked unchanged.
* :func:`coverage` runs a producer twice (two different poisons) and returns, per output, a
  :class:`Coverage` that sorts every storage element into one of three classes: WRITTEN (its final
  value is the same under both poisons), NEVER WRITTEN (it still holds the poison in both runs) and
  READ BEFORE WRITTEN (its final value depends on the poison: the producer read the buffer, e.g.
  ``out += x``, split-K partial sums, atomics), plus which elements lie inside the view, and a report
  that names the index ranges of each bad class. :func:`assert_fully_written` turns that into an
  assertion that fails on either bad class.
* :func:`consumer_differential` runs producer + consumer on storage poisoned two ways: if the
  consumer's result differs, it read bytes that nobody wrote.
* :func:`find_redundant_zero_fills` runs any callable with each zero fill (``torch.zeros``,
  ``zeros_like``, ``new_zeros``, ``Tensor.zero_``, ``fill_(0)``, ``full(.., 0)``, ``t[...] = 0``)
  replaced by poison, one call site at a time, and says per ``file:line`` whether that zero fill
  changed any output.

Two poisons, not one, that differ in every byte: a producer may write a value equal to one poison (it
still counts as written: the value is the same in both runs), and an accumulating producer, whose
result depends on what the buffer held, gives different results under the two poisons. "Differs from
the poison" is not the test for a write: ``out = torch.empty_like(x); out += x`` leaves values that
differ from the poison, yet every one of them was computed from garbage.
"""
from __future__ import annotations

import contextlib
import math
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = [
    "POISONS", "poisons_for", "poison_", "storage_bytes", "storage_view", "poisoned_allocations",
    "Coverage", "coverage", "assert_fully_written", "ConsumerCheck", "consumer_differential",
    "assert_consumer_reads_only_written", "ZeroFillSite", "ZeroFillReport", "find_redundant_zero_fills",
    "bounds_checked",
]

# Poison patterns. "nan" fills floating-point elements with NaN (float8_e4m3fn: 0x7F); "a5" and "7f"
# fill every byte with 0xA5 / 0x7F (an int32 becomes 0xA5A5A5A5 / 0x7F7F7F7F).
POISONS = ("nan", "a5", "7f")


def poisons_for(dtype: torch.dtype) -> tuple[str, str]:
    """The two poisons used for ``dtype``: NaN and 0xA5 bytes for floats, 0xA5 and 0x7F for integers."""
    return ("nan", "a5") if dtype.is_floating_point else ("a5", "7f")


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 tensor over the whole storage of ``t`` (every byte, whatever the view covers)."""
    s = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(s, 0, (s.nbytes(),), (1,))


def storage_view(t: torch.Tensor) -> torch.Tensor:
    """The whole storage of ``t`` as a tensor of ``t``'s dtype, in its natural shape.

    The natural shape is the shape of the allocation the view came from (``t._base``) when that base
    is contiguous and spans the storage, else a flat vector of all storage elements.
    """
    item = t.element_size()
    n = t.untyped_storage().nbytes() // item
    shape: tuple[int, ...] = (n,)
    base = t._base if t._base is not None else t
    if base.is_contiguous() and base.storage_offset() == 0 and base.numel() == n and base.dim() > 0:
        shape = tuple(base.shape)
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (n,), (1,))
    return flat.view(shape)


def poison_(t: torch.Tensor, pattern: str = "nan") -> torch.Tensor:
    """Fill the WHOLE storage under ``t`` with ``pattern`` (see :data:`POISONS`); returns ``t``."""
    if pattern not in POISONS:
        raise ValueError(f"pattern must be one of {POISONS}, got {pattern!r}")
    if pattern == "nan":
        if not t.dtype.is_floating_point:
            raise TypeError(f"the 'nan' poison needs a floating-point tensor, got {t.dtype}; use 'a5' or '7f'")
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            storage_bytes(t).fill_(0x7F)  # NaN in e4m3fn; in e5m2 0x7F is NaN too
        else:
            storage_view(t).view(-1).fill_(float("nan"))
    else:
        storage_bytes(t).fill_(0xA5 if pattern == "a5" else 0x7F)
    return t


EMPTY_OPS = {
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.empty_like.default,
    torch.ops.aten.new_empty.default,
    torch.ops.aten.new_empty_strided.default,
}


class poisoned_allocations(TorchDispatchMode):
    """Inside this context every ``torch.empty``/``empty_like``/``new_empty``/``empty_strided``
    returns memory filled with poison, so a launcher that allocates its outputs with ``empty`` can be
    checked exactly as it ships. (``zeros`` is left alone: it is a write, not garbage.)

    ``which=0`` / ``which=1`` pick the first / second poison of each allocation's dtype
    (:func:`poisons_for`: NaN / 0xA5 for floats, 0xA5 / 0x7F for integers), so the two runs of a
    differential check differ in every byte whatever the dtype. A pattern name ('nan', 'a5', '7f')
    forces one pattern ('nan' falls back to 'a5' for integer dtypes).
    """

    def __init__(self, which: int | str = 0):
        super().__init__()
        if which not in (0, 1) and which not in POISONS:
            raise ValueError(f"which must be 0, 1 or one of {POISONS}, got {which!r}")
        self.which = which
        self.count = 0

    def pattern_for(self, dtype: torch.dtype) -> str:
        if self.which in (0, 1):
            return poisons_for(dtype)[self.which]
        if self.which == "nan" and not dtype.is_floating_point:
            return "a5"
        return self.which

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in EMPTY_OPS and isinstance(out, torch.Tensor) and out.untyped_storage().nbytes():
            poison_(out, self.pattern_for(out.dtype))
            self.count += 1
        return out


# --------------------------------------------------------------------------------------------------
# Coverage of a producer
# --------------------------------------------------------------------------------------------------

def _ranges(idx: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted integers -> inclusive runs [(start, end), ...]."""
    runs: list[tuple[int, int]] = []
    for i in idx:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _fmt_runs(runs: list[tuple[int, int]], limit: int = 6) -> str:
    parts = [f"{a}" if a == b else f"{a}..{b}" for a, b in runs[:limit]]
    if len(runs) > limit:
        parts.append(f"... ({len(runs) - limit} more runs)")
    return ", ".join(parts)


@dataclass
class Coverage:
    """What a producer did to every element of a tensor's whole storage.

    The masks are bool tensors (on the CPU) in the storage's natural shape (see :func:`storage_view`).
    Every storage element is in exactly one class:

    * ``written``: all its bytes end with the same value under both poisons (a value that happens to
      equal a poison included): the producer wrote it without looking at what was there;
    * ``never_written``: all its bytes still hold the poison, in both runs;
    * ``read_before_written``: its final value depends on the poison: the producer read the element
      before (or instead of) writing it: ``out += x``, partial sums added into the output (split-K),
      atomics. Such a buffer needs ``zeros`` (or a first pass that stores instead of adding);
    * ``partially_written``: some bytes written, the others still poison (a narrow store into a wide
      element);
    * ``nondeterministic``: two runs on the SAME poison ended with different values, so comparing the
      two poisons proves nothing about it (checked only when some element's value depended on the
      poison; see :func:`coverage`).

    ``in_view`` marks the elements the returned view covers; everything else is outside the view.
    "Unwritten" (``unwritten_in_view``, ``unwritten_ranges``, ...) means *not written*: any class but
    ``written``.
    """

    name: str
    dtype: torch.dtype
    view_shape: tuple[int, ...]
    view_stride: tuple[int, ...]
    written: torch.Tensor
    in_view: torch.Tensor
    partially_written: torch.Tensor = field(repr=False)
    read_before_written: torch.Tensor | None = field(default=None, repr=False)
    nondeterministic: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.read_before_written is None:
            # audit: ok -- the default mask: all False (nothing read before written) is its value
            self.read_before_written = torch.zeros_like(self.written)
        if self.nondeterministic is None:
            # audit: ok -- the default mask: all False (nothing nondeterministic) is its value
            self.nondeterministic = torch.zeros_like(self.written)

    @property
    def storage_shape(self) -> tuple[int, ...]:
        return tuple(self.written.shape)

    @property
    def never_written(self) -> torch.Tensor:
        return ~(self.written | self.read_before_written | self.partially_written | self.nondeterministic)

    @property
    def unwritten_in_view(self) -> torch.Tensor:
        return self.in_view & ~self.written

    @property
    def unwritten_outside_view(self) -> torch.Tensor:
        return ~self.in_view & ~self.written

    @property
    def view_fully_written(self) -> bool:
        return not bool(self.unwritten_in_view.any())

    @property
    def storage_fully_written(self) -> bool:
        return bool(self.written.all())

    @property
    def accumulated(self) -> bool:
        """True when some element's final value depends on what the buffer held (read before written)."""
        return bool(self.read_before_written.any())

    def ranges(self, mask: torch.Tensor) -> str:
        """Human-readable index ranges of a bool mask in storage coordinates ('none' when empty)."""
        if not mask.any():
            return "none"
        if mask.dim() == 2:
            # consecutive rows with the same columns form one group: an L-shaped gap reads
            # "rows 0..0 cols 3..3; rows 1..127 cols 0..3", not as its bounding box
            groups: list[list] = []  # [first_row, last_row, column runs]
            for r in mask.any(dim=1).nonzero().flatten().tolist():
                cols = _ranges(mask[r].nonzero().flatten().tolist())
                if groups and groups[-1][1] == r - 1 and groups[-1][2] == cols:
                    groups[-1][1] = r
                else:
                    groups.append([r, r, cols])
            parts = [f"rows {a}..{b} cols {_fmt_runs(cols, 3)}" for a, b, cols in groups[:6]]
            extra = len(groups) - 6
            return "; ".join(parts) + (f"; ... ({extra} more row groups)" if extra > 0 else "")
        flat = mask.flatten().nonzero().flatten().tolist()
        return "flat elements " + _fmt_runs(_ranges(flat))

    def _where(self, where: str) -> torch.Tensor:
        if where not in ("storage", "view", "outside"):
            raise ValueError(f"where must be 'storage', 'view' or 'outside', got {where!r}")
        return {"storage": torch.ones_like(self.in_view), "view": self.in_view, "outside": ~self.in_view}[where]

    def unwritten_ranges(self, where: str = "storage") -> str:
        """Ranges not written (any class but ``written``); ``where`` is 'storage', 'view' or 'outside'."""
        return self.ranges(self._where(where) & ~self.written)

    def never_written_ranges(self, where: str = "storage") -> str:
        return self.ranges(self._where(where) & (self.never_written | self.partially_written))

    def read_before_written_ranges(self, where: str = "storage") -> str:
        return self.ranges(self._where(where) & self.read_before_written)

    def problems(self, scope: str = "storage") -> list[str]:
        """One teaching sentence per bad class found in ``scope`` ('storage' or 'view'); [] when clean."""
        where = self._where(scope)
        out = []
        never = where & (self.never_written | self.partially_written)
        if never.any():
            out.append(f"{self.name}: {int(never.sum())} element(s) were NEVER WRITTEN ({self.ranges(never)}): "
                       "they still hold torch.empty's poison in both runs, so whoever reads them reads "
                       "garbage. Write them in the producer (or keep zeros).")
        acc = where & self.read_before_written
        if acc.any():
            out.append(f"{self.name}: {int(acc.sum())} element(s) were READ BEFORE WRITTEN, i.e. accumulated "
                       f"into ({self.ranges(acc)}): their final values differ between the two poisons, so the "
                       "producer reads the buffer (out += x, split-K partial sums, atomics) and its result "
                       "depends on whatever torch.empty left there. This buffer needs torch.zeros, or the "
                       "first write must store instead of add.")
        nondet = where & self.nondeterministic
        if nondet.any():
            out.append(f"{self.name}: {int(nondet.sum())} element(s) differ between two runs on the SAME poison "
                       f"({self.ranges(nondet)}): the producer is not deterministic there (e.g. float atomics "
                       "in a varying order), so poisoning cannot prove them written. Check them with a "
                       "deterministic variant (integer atomics, a fixed reduction order).")
        return out

    def report(self) -> str:
        n, nv = self.written.numel(), int(self.in_view.sum())
        not_acc = ~self.read_before_written & ~self.nondeterministic
        lines = [
            f"{self.name}: view {list(self.view_shape)} stride {list(self.view_stride)} "
            f"over storage {list(self.storage_shape)} {str(self.dtype).replace('torch.', '')}",
            f"  written: {int(self.written.sum())}/{n} storage elements; view elements written: "
            f"{int((self.written & self.in_view).sum())}/{nv}",
            f"  unwritten inside the view : {self.ranges(self.unwritten_in_view & not_acc)}",
            f"  unwritten outside the view: {self.ranges(self.unwritten_outside_view & not_acc)}",
        ]
        if self.accumulated:
            lines += [
                f"  READ BEFORE WRITTEN (accumulated into) inside the view : {self.read_before_written_ranges('view')}",
                f"  READ BEFORE WRITTEN (accumulated into) outside the view: {self.read_before_written_ranges('outside')}",
                "    (final values depend on the poison: the producer reads this buffer, so it needs zeros)",
            ]
        if self.partially_written.any():
            lines.append(f"  partially written elements: {int(self.partially_written.sum())}")
        if self.nondeterministic.any():
            lines.append(f"  NONDETERMINISTIC (differ between runs on the same poison): "
                         f"{self.ranges(self.nondeterministic)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()

    _repr_pretty_ = lambda self, p, cycle: p.text(self.report())  # noqa: E731  (Jupyter display)


def _tensors(tree) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(tree)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


@dataclass
class _Snap:
    """A copy of one output's whole storage (as bytes, on the CPU) plus how the view sits in it."""

    data: torch.Tensor
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    natural_shape: tuple[int, ...]

    @classmethod
    def of(cls, t: torch.Tensor) -> "_Snap":
        return cls(storage_bytes(t).cpu().clone(), t.dtype, tuple(t.shape), tuple(t.stride()),
                   t.storage_offset(), tuple(storage_view(t).shape))


def _poison_bytes(snap: _Snap, pattern: str) -> torch.Tensor:
    """The bytes ``snap``'s storage would hold if nothing had been written after poisoning."""
    ref = torch.empty(snap.data.numel() // _itemsize(snap.dtype), dtype=snap.dtype)
    return storage_bytes(poison_(ref, pattern))


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _coverage_from_runs(name: str, a: _Snap, b: _Snap, pa: str, pb: str, a_again: _Snap | None = None) -> Coverage:
    """Element classes from the same output's storage after the two poisoned runs (``a_again``: a
    second run on ``a``'s poison, to tell poison-dependence from nondeterminism)."""
    item = _itemsize(a.dtype)
    A, B = a.data.view(-1, item), b.data.view(-1, item)
    same = A == B                                                                   # per byte
    pristine = (A == _poison_bytes(a, pa).view(-1, item)) & (B == _poison_bytes(b, pb).view(-1, item))
    written = same.all(dim=1)            # the two poisons differ in every byte, so same and pristine
    never = pristine.all(dim=1)          # exclude each other byte by byte
    partial = ~written & ~never & (same | pristine).all(dim=1)
    dependent = ~written & ~never & ~partial
    nondet = torch.zeros_like(written)
    if a_again is not None:
        nondet = (A != a_again.data.view(-1, item)).any(dim=1)
        dependent &= ~nondet
        nondet &= ~written
    shape = a.natural_shape
    n = A.shape[0]
    in_view = torch.zeros(n, dtype=torch.bool)
    if math.prod(a.shape):
        idx = torch.arange(n).as_strided(a.shape, a.stride, a.offset)
        in_view[idx.reshape(-1)] = True
    return Coverage(name, a.dtype, a.shape, a.stride, written.view(shape), in_view.view(shape),
                    partial.view(shape), dependent.view(shape), nondet.view(shape))


def _clone_args(tree):
    return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


def coverage(fn: Callable, *args, out=None, names: list[str] | None = None, **kwargs) -> list[Coverage]:
    """Run ``fn(*args, **kwargs)`` on poisoned memory, once per poison, and classify every storage
    element of its outputs (see :class:`Coverage`): written (same final value under both poisons),
    never written (poison in both runs), or read before written (the final value depends on the
    poison: accumulation into the buffer).

    * ``out=None``: ``fn`` allocates its outputs (with ``torch.empty`` or friends); they are poisoned
      through :class:`poisoned_allocations` and the returned tensors are inspected.
    * ``out=tensor or tuple``: ``fn`` writes into those caller-owned buffers (pass them in ``args``
      too); their whole storages are poisoned before each run.

    When some element's value depends on the poison, ``fn`` runs a third time on the first poison: an
    element that differs between the two runs on the same poison is reported as nondeterministic
    instead. ``fn`` must not change its inputs. Returns one :class:`Coverage` per output, in order.
    """
    def run(k: int) -> tuple[list[_Snap], list[str]]:
        if out is not None:
            outs = _tensors(out)
            pats = [poisons_for(t.dtype)[k] for t in outs]
            for t, p in zip(outs, pats):
                poison_(t, p)
            fn(*args, **kwargs)
        else:
            with poisoned_allocations(k):
                outs = _tensors(fn(*args, **kwargs))
            pats = [poisons_for(t.dtype)[k] for t in outs]
        return [_Snap.of(t) for t in outs], pats

    (ra, pa), (rb, pb) = run(0), run(1)
    if len(ra) != len(rb):
        raise RuntimeError("the producer returned a different number of tensors in the two runs")
    names = list(names or [])
    covs = [_coverage_from_runs(names[i] if i < len(names) else f"output[{i}]", a, b, x, y)
            for i, (a, b, x, y) in enumerate(zip(ra, rb, pa, pb))]
    if any(c.accumulated for c in covs):  # poison-dependent, or just nondeterministic? run again
        ra2, _ = run(0)
        covs = [_coverage_from_runs(c.name, a, b, x, y, a2)
                for c, a, b, x, y, a2 in zip(covs, ra, rb, pa, pb, ra2)]
    return covs


def assert_fully_written(fn: Callable, *args, scope: str = "storage", out=None,
                         names: list[str] | None = None, why: str = "", **kwargs) -> list[Coverage]:
    """Assert that ``fn`` writes every element of its outputs, and reads none of them first.

    Fails on elements never written (they hold whatever ``torch.empty`` handed out) and on elements
    read before written (accumulated into: the result depends on the buffer's old contents, so the
    buffer needs ``zeros``), with a message that names the ranges of each.

    ``scope='storage'`` demands the whole storage (padding included: needed when a consumer reads
    whole tiles); ``scope='view'`` only the elements each returned view covers (enough when nothing
    reads outside the view, e.g. TMA-aligned rows beyond M).
    """
    if scope not in ("storage", "view"):
        raise ValueError(f"scope must be 'storage' or 'view', got {scope!r}")
    covs = coverage(fn, *args, out=out, names=names, **kwargs)
    bad = [c for c in covs if not (c.storage_fully_written if scope == "storage" else c.view_fully_written)]
    if bad:
        msg = [f"{len(bad)} output(s) not fully written ({scope} scope), so torch.empty is not safe for "
               "them." + (f" {why}" if why else "")]
        for c in bad:
            msg += c.problems(scope)
            msg.append(c.report())
        raise AssertionError("\n".join(msg))
    return covs


# --------------------------------------------------------------------------------------------------
# Consumers
# --------------------------------------------------------------------------------------------------

@dataclass
class ConsumerCheck:
    """Result of running a consumer on a producer's outputs poisoned two different ways."""

    identical: bool
    n_differ: int
    n_total: int
    max_abs_diff: float

    def report(self) -> str:
        if self.identical:
            return (f"consumer result identical under both poisons ({self.n_total} elements): it reads "
                    "only bytes the producer wrote")
        return (f"consumer result DIFFERS between the two poisons in {self.n_differ}/{self.n_total} "
                f"elements (max |diff| {self.max_abs_diff:g}): it reads bytes nobody wrote")

    __str__ = report
    _repr_pretty_ = lambda self, p, cycle: p.text(self.report())  # noqa: E731


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype.is_floating_point:
        af, bf = a.float(), b.float()
        return (af == bf) | (torch.isnan(af) & torch.isnan(bf))
    return a == b


def consumer_differential(producer: Callable, consumer: Callable, *args, **kwargs) -> ConsumerCheck:
    """Run ``consumer(*producer(*args, **kwargs))`` (a tuple or list result is unpacked) with the
    producer's ``empty`` allocations poisoned two ways. A consumer that only reads written bytes
    gives bit-identical results; one that reads unwritten bytes almost surely does not."""
    res = []
    for which in (0, 0, 1):
        with poisoned_allocations(which):
            produced = producer(*args, **kwargs)
        produced = tuple(produced) if isinstance(produced, (tuple, list)) else (produced,)
        res.append(_tensors(consumer(*produced)))
    if not _outputs_equal(res[0], res[1])[0]:
        raise RuntimeError("producer + consumer are not deterministic: two runs on the same poison gave "
                           "different results, so a difference between poisons would prove nothing")
    res = [res[0], res[2]]
    n_diff, n_tot, max_diff = 0, 0, 0.0
    for ra, rb in zip(*res):
        same = _same(ra, rb)
        n_diff += int((~same).sum())
        n_tot += same.numel()
        if (~same).any():
            d = (ra.double() - rb.double()).abs()
            d = d[~same]
            max_diff = max(max_diff, float(d.nan_to_num(nan=math.inf).max()))
    return ConsumerCheck(n_diff == 0, n_diff, n_tot, max_diff)


def assert_consumer_reads_only_written(producer: Callable, consumer: Callable, *args, why: str = "", **kwargs) -> ConsumerCheck:
    chk = consumer_differential(producer, consumer, *args, **kwargs)
    if not chk.identical:
        raise AssertionError(chk.report() + (f". {why}" if why else ""))
    return chk


# --------------------------------------------------------------------------------------------------
# The redundant zero-fill detector
# --------------------------------------------------------------------------------------------------

_THIS_FILE = __file__


def _call_site() -> str:
    """file:line of the innermost frame outside torch and this module."""
    for fr in reversed(traceback.extract_stack()[:-1]):
        f = fr.filename
        if f == _THIS_FILE or "/torch/" in f or f.endswith("contextlib.py") or "/torch\\" in f:
            continue
        if "ipykernel_" in f or f.startswith("<ipython-input"):
            return f"<notebook cell>:{fr.lineno}"  # cell file names change from run to run
        short = f if len(f) < 60 else "..." + f[-57:]
        return f"{short}:{fr.lineno}"
    return "<unknown>"


def _is_zero(v) -> bool:
    return isinstance(v, (int, float, bool)) and not isinstance(v, complex) and v == 0


class _ZeroFillMode(TorchFunctionMode):
    """Records zero fills by call site; poisons those at ``poison_sites`` with ``pattern``."""

    def __init__(self, poison_sites=(), which: int = 0):
        super().__init__()
        self.poison_sites = set(poison_sites)
        self.which = which
        self.sites: dict[str, dict[str, Any]] = {}

    def _kind(self, func, args, kwargs) -> str | None:
        name = getattr(func, "__name__", "")
        if func in (torch.zeros, torch.zeros_like):
            return f"torch.{name}"
        if name == "new_zeros":
            return "Tensor.new_zeros"
        if name == "zero_":
            return "Tensor.zero_"
        if name == "fill_" and len(args) >= 2 and _is_zero(args[1]):
            return "Tensor.fill_(0)"
        if func in (torch.full, torch.full_like):
            value = args[1] if len(args) >= 2 else kwargs.get("fill_value")
            if _is_zero(value):
                return f"torch.{name}(.., 0)"
        if name == "__setitem__" and len(args) == 3 and _is_zero(args[2]):
            return "Tensor[...] = 0"
        return None

    def _poison_like(self, t: torch.Tensor) -> torch.Tensor:
        if t.dtype == torch.bool:
            return torch.ones_like(t, memory_format=torch.contiguous_format)
        return poison_(torch.empty_like(t, memory_format=torch.contiguous_format), poisons_for(t.dtype)[self.which])

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        kind = self._kind(func, args, kwargs)
        if kind is None:
            return out
        target = args[0][args[1]] if kind == "Tensor[...] = 0" else out
        if not isinstance(target, torch.Tensor):
            return out
        site = _call_site()
        rec = self.sites.setdefault(site, {"op": kind, "calls": 0})
        rec["calls"] += 1
        if site in self.poison_sites:
            poison = self._poison_like(target)
            if kind == "Tensor[...] = 0":  # poison exactly the elements the assignment zeroed
                args[0][args[1]] = poison
            else:
                out.copy_(poison)
        return out


@dataclass
class ZeroFillSite:
    site: str
    op: str
    calls: int
    redundant: bool
    detail: str


@dataclass
class ZeroFillReport:
    sites: list[ZeroFillSite]

    @property
    def redundant(self) -> list[str]:
        return [s.site for s in self.sites if s.redundant]

    @property
    def necessary(self) -> list[str]:
        return [s.site for s in self.sites if not s.redundant]

    def verdict(self, needle: str) -> str:
        """'redundant' or 'necessary' for the one site whose file:line contains ``needle``."""
        hits = [s for s in self.sites if needle in s.site]
        if len(hits) != 1:
            raise KeyError(f"{needle!r} matches {len(hits)} zero-fill sites: {[s.site for s in self.sites]}")
        return "redundant" if hits[0].redundant else "necessary"

    def report(self) -> str:
        if not self.sites:
            return "no zero fills ran"
        w = max(len(s.site) for s in self.sites)
        lines = [f"{'call site':<{w}}  {'op':<16} {'calls':>5}  verdict"]
        for s in self.sites:
            v = "REDUNDANT (use empty)" if s.redundant else "necessary"
            lines.append(f"{s.site:<{w}}  {s.op:<16} {s.calls:>5}  {v}: {s.detail}")
        return "\n".join(lines)

    __str__ = report
    _repr_pretty_ = lambda self, p, cycle: p.text(self.report())  # noqa: E731


def _outputs_equal(a, b) -> tuple[bool, int]:
    la, lb = tree_flatten(a)[0], tree_flatten(b)[0]
    others_a = [x for x in la if not isinstance(x, torch.Tensor)]
    others_b = [x for x in lb if not isinstance(x, torch.Tensor)]
    if others_a != others_b and not all(_same_scalar(x, y) for x, y in zip(others_a, others_b)):
        return False, -1
    ta, tb = _tensors(a), _tensors(b)
    if len(ta) != len(tb):
        return False, -1
    n = 0
    for x, y in zip(ta, tb):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, -1
        n += int((~_same(x, y)).sum())
    return n == 0, n


def _same_scalar(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return type(x) is type(y) and x == y


def find_redundant_zero_fills(fn: Callable, *args, **kwargs) -> ZeroFillReport:
    """Find the zero fills in ``fn`` that change nothing.

    ``fn(*args, **kwargs)`` runs once to record every zero fill by call site (``file:line``), then
    once per site and poison (NaN and 0xA5 bytes for floats; 0xA5 / 0x7F bytes for integers) with
    only that site's fills replaced by poison. Outputs are ``fn``'s return value plus every tensor
    argument (so fills of caller-owned buffers count). A site whose poisoning leaves all outputs
    bit-identical is redundant: ``empty`` would do. ``fn`` must be deterministic (checked).

    A poisoned fill that makes ``fn`` raise counts as necessary. On a GPU, a poisoned integer used as
    an index trips a device-side assert that ends the CUDA context: run such code on CPU tensors.
    """
    def run(mode):
        a, kw = _clone_args(args), _clone_args(kwargs)
        with mode:
            r = fn(*a, **kw)
        return (r, a, kw)

    rec = _ZeroFillMode()
    ref = run(rec)
    same, _ = _outputs_equal(ref, run(_ZeroFillMode()))
    if not same:
        raise RuntimeError("fn is not deterministic: two plain runs gave different outputs, so a "
                           "difference under poison would prove nothing")
    sites = []
    for site, info in rec.sites.items():
        diffs = []
        for which in (0, 1):
            label = "1st poison" if which == 0 else "2nd poison"
            try:
                same, n = _outputs_equal(ref, run(_ZeroFillMode([site], which)))
            except Exception as e:  # e.g. a poisoned index tensor: the zeros were read
                if "device-side assert" in str(e) or type(e).__name__ == "AcceleratorError":
                    raise RuntimeError(
                        f"poisoning the zero fill at {site} made a CUDA kernel fail ({type(e).__name__}, e.g. an "
                        "index out of range): that fill is necessary, but this CUDA context is now unusable. "
                        "Run find_redundant_zero_fills on CPU tensors for code that uses zero-filled "
                        "integers as indices.") from e
                diffs.append(f"{label}: fn raised {type(e).__name__}")
                continue
            if not same:
                diffs.append(f"{label}: {n if n >= 0 else 'non-tensor/shape/dtype'} output elements changed")
        redundant = not diffs
        detail = ("outputs bit-identical with this fill poisoned two ways" if redundant
                  else "; ".join(diffs) + " when poisoned")
        sites.append(ZeroFillSite(site, info["op"], info["calls"], redundant, detail))
    return ZeroFillReport(sites)


@contextlib.contextmanager
def bounds_checked():
    """Inside this block every load and store of a Triton kernel run in the interpreter must fall in
    the storage of one of that launch's tensor arguments (masked-off lanes excepted), else it raises
    ``IndexError`` naming the access and the number of stray elements. The interpreter itself does
    not check: a stray address reads or corrupts host memory, or crashes much later; on a GPU the same
    bug is an illegal memory access (find it there with compute-sanitizer). Interpreter only: patches
    its builder for the duration of the block."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("bounds_checked() checks addresses in Triton's interpreter (TRITON_INTERPRET=1); "
                           "on a GPU run the kernel under compute-sanitizer instead")
    import numpy as np
    import triton.runtime.interpreter as interp

    ranges: list[tuple[int, int]] = []
    builder = interp.interpreter_builder
    real_init = interp.GridExecutor._init_args_hst
    real_ld, real_st = builder.create_masked_load, builder.create_masked_store

    def init(self, args_dev, kwargs):
        args, kw = real_init(self, args_dev, kwargs)
        ranges[:] = [(a.untyped_storage().data_ptr(), a.untyped_storage().data_ptr() + a.untyped_storage().nbytes())
                     for a in (*args, *kw.values()) if hasattr(a, "untyped_storage")]
        return args, kw

    def check(ptrs, mask, what):
        p = ptrs.data[mask.data.astype(bool)]
        size = np.dtype(interp._get_np_dtype(ptrs.get_element_ty())).itemsize
        ok = np.zeros(p.shape, bool)
        for lo, hi in ranges:
            ok |= (p >= lo) & (p + size <= hi)
        if not ok.all():
            raise IndexError(f"{what} of {int((~ok).sum())} elements outside every tensor argument")

    builder.create_masked_load = lambda ptrs, mask, other, cp, vol: (check(ptrs, mask, "load"),
                                                                     real_ld(ptrs, mask, other, cp, vol))[1]
    builder.create_masked_store = lambda ptrs, val, mask, cp: (check(ptrs, mask, "store"), real_st(ptrs, val, mask, cp))[1]
    interp.GridExecutor._init_args_hst = init
    try:
        yield
    finally:
        interp.GridExecutor._init_args_hst = real_init
        del builder.create_masked_load, builder.create_masked_store
