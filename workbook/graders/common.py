"""What the graders of every notebook share, so that one mistake gets one answer everywhere.

* :func:`zero_fill_message`: the words for a zero-filled output where the statement says
  ``torch.empty`` (notebooks 01, 02, 03 and 07 ask for it; the words are notebook 01's).
* :class:`GuardedAllocations`: every ``torch.empty`` (and zero-filled allocation) inside it returns a
  poisoned tensor at the start of a storage a guard zone longer, and the zero fills are recorded. A
  store past the end of a too-small allocation lands in the guard, where :func:`run_guarded` finds it
  and names the buffer; in Triton's interpreter it would otherwise land in the host heap and can kill
  the Python kernel ("corrupted double-linked list").
* :func:`run_guarded`: a participant's launcher run inside both guards (the guard zone and, in the
  interpreter, :func:`workbook.coverage.bounds_checked`), each stray store or load an
  ``AssertionError`` that names the buffer or the access.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..coverage import EMPTY_OPS, bounds_checked, poison_, poisons_for, storage_bytes

__all__ = ["zero_fill_message", "GuardedAllocations", "run_guarded", "check_zero_fills"]


def zero_fill_message(case: str, buffer: str, op: str, writes: str, twice: str = "them") -> str:
    """The one answer to a zero fill where the statement says ``torch.empty``: ``case`` names the
    input (``"[1x64]"``, ``"M=13, N=6"``), ``buffer`` the output, ``op`` the call that filled it,
    ``writes`` who writes every byte instead, ``twice`` what the zero fill therefore writes twice."""
    return (f"{case}: `{buffer}` was zero-filled ({op}): that is the extra memset kernel this workbook "
            f"removes. Allocate it with torch.empty: {writes}, so a zero fill writes {twice} twice.")


def _zero_value(args, kwargs) -> bool:
    value = args[1] if len(args) > 1 else kwargs.get("fill_value", kwargs.get("value"))
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    return isinstance(value, (int, float, bool)) and value == 0


class GuardedAllocations(TorchDispatchMode):
    """Inside this mode every ``torch.empty``/``empty_like``/``new_empty``/``empty_strided`` (and every
    zero-filled allocation: ``zeros``, ``zeros_like``, ``new_zeros``, ``full(.., 0)``) returns a tensor
    of the shape asked for at the start of a storage ``guard`` bytes longer, the whole storage poisoned
    (``poisons_for(dtype)[which]``; zero allocations hold zeros in their own bytes). A store past the
    end of an allocation lands in its guard, and :meth:`overruns` finds it. :attr:`zero_fills` maps the
    storage of each zero-filled allocation, and of each allocation later filled whole by ``zero_()``
    or ``fill_(0)`` (``t[:] = 0`` too), to the call that did it."""

    _ZERO_ALLOCS = {"aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::full", "aten::full_like",
                    "aten::new_full"}
    _NAMES = {"aten::zero_": "Tensor.zero_()", "aten::fill_": "Tensor.fill_(0)"}

    def __init__(self, which: int = 0, guard: int = 4096):
        super().__init__()
        self.which, self.guard = which, guard
        self.allocs: list[dict] = []        # shape, dtype, nbytes, ptr, tensor, guard snapshot
        self.zero_fills: dict[int, str] = {}  # storage ptr -> the call that zero-filled it

    def _guarded(self, out: torch.Tensor, fill_zero: bool) -> torch.Tensor:
        nbytes, item = out.untyped_storage().nbytes(), out.element_size()
        big = torch.empty(-(-(nbytes + self.guard) // item), dtype=out.dtype, device=out.device)
        poison_(big, poisons_for(out.dtype)[self.which])
        if fill_zero:
            storage_bytes(big)[:nbytes].zero_()
        t = torch.empty(0, dtype=out.dtype, device=out.device).set_(big.untyped_storage(), 0, out.shape, out.stride())
        self.allocs.append(dict(shape=list(out.shape), dtype=out.dtype, nbytes=nbytes,
                                ptr=t.untyped_storage().data_ptr(), tensor=t,
                                snapshot=storage_bytes(big)[nbytes:].clone()))
        return t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor):
            return out
        name = func._schema.name
        if name in ("aten::full", "aten::full_like", "aten::new_full", "aten::fill_"):
            zero = _zero_value(args, kwargs)
        else:
            zero = name in ("aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::zero_")
        if (func in EMPTY_OPS or (zero and name in self._ZERO_ALLOCS)) and out.untyped_storage().nbytes():
            out = self._guarded(out, fill_zero=func not in EMPTY_OPS)
            if func not in EMPTY_OPS:
                self.zero_fills[out.untyped_storage().data_ptr()] = f"torch.{name[6:]}"
        elif zero and name in self._NAMES:
            ptr = out.untyped_storage().data_ptr()
            mine = [a for a in self.allocs if a["ptr"] == ptr]
            if mine and out.numel() * out.element_size() >= mine[0]["nbytes"]:   # the whole allocation
                self.zero_fills.setdefault(ptr, self._NAMES[name])
        return out

    def nbytes(self, t: torch.Tensor) -> int:
        """The bytes ``t``'s storage was allocated with (its guard zone not counted)."""
        ptr = t.untyped_storage().data_ptr()
        return next((a["nbytes"] for a in self.allocs if a["ptr"] == ptr), t.untyped_storage().nbytes())

    def overruns(self):
        """(allocation, bytes changed in its guard, farthest changed byte past its end) per overrun."""
        found = []
        for a in self.allocs:
            now = storage_bytes(a["tensor"])[a["nbytes"]:]
            changed = (now != a["snapshot"]).nonzero().flatten()
            if len(changed):
                found.append((a, len(changed), int(changed[-1]) + 1))
        return found


def _check_overruns(mode: GuardedAllocations, named: Iterable[tuple[str, object]], case: str,
                    needs: dict[str, str]) -> None:
    """Raise, naming the buffer (by its name in ``named`` and what ``needs`` says it needs), when a
    store landed past the end of an allocation."""
    named = [(n, t) for n, t in named if isinstance(t, torch.Tensor)]
    for a, n, far in mode.overruns():
        what = f"{a['shape']} {str(a['dtype']).replace('torch.', '')} = {a['nbytes']} bytes"
        for name, t in named:
            if t.untyped_storage().data_ptr() == a["ptr"]:
                need = f"; {needs[name]}" if name in needs else ""
                what = f"`{name}` (allocated {what}{need})"
                break
        else:
            what = f"a buffer your launcher allocated ({what})"
        raise AssertionError(
            f"{case}: your kernel stored past the end of {what}: {n} bytes changed up to {far} bytes past "
            "its end. The grader caught them in a guard zone; without it they overwrite whatever memory "
            "comes next (in Triton's interpreter that can kill the Python kernel, e.g. 'corrupted "
            "double-linked list'; on a GPU an illegal memory access, or silent corruption). Allocate "
            "the size the kernel writes.")


def run_guarded(call: Callable[[], object], case: str, *, which: int = 0, guard: int = 4096,
                outputs: Callable[[object], list[tuple[str, object]]] = lambda out: [],
                needs: dict[str, str] | None = None):
    """``call()`` with its allocations poisoned (``which``) and guarded, under ``bounds_checked`` in the
    interpreter. Returns ``(result, mode)``. A store past an allocation, or a stray access beyond every
    guard, is an ``AssertionError`` naming it (``outputs(result)`` names the returned buffers, ``needs``
    says what size each one needs); any other exception goes through to :func:`workbook.check.grade`."""
    mode = GuardedAllocations(which, guard)
    checked = bounds_checked() if os.environ.get("TRITON_INTERPRET") == "1" else contextlib.nullcontext()
    try:
        with checked, mode:
            out = call()
    except Exception as e:   # a stray access beyond every guard: bounds_checked stopped it
        if "outside every tensor argument" not in str(e):
            raise
        _check_overruns(mode, [], case, needs or {})
        access = "store" if "store of" in str(e) else "load"
        raise AssertionError(
            f"{case}: your kernel tried a {access} outside every tensor it was given (stopped before "
            "it happened; unchecked, a stray store can kill the Python kernel in Triton's "
            "interpreter, and is an illegal memory access on a GPU). Check the offsets and the "
            "masks of your loads and stores against the shapes you allocated.") from None
    _check_overruns(mode, outputs(out), case, needs or {})
    return out, mode


def check_zero_fills(mode: GuardedAllocations, named: Iterable[tuple[str, object]], case: str,
                     writes: dict[str, str], twice: str = "them") -> None:
    """Raise :func:`zero_fill_message` for the first of the ``named`` outputs that ``mode`` saw
    zero-filled; ``writes[name]`` says who writes every byte of it instead."""
    for name, t in named:
        op = mode.zero_fills.get(t.untyped_storage().data_ptr()) if isinstance(t, torch.Tensor) else None
        if op:
            raise AssertionError(zero_fill_message(case, name, op, writes[name], twice))
