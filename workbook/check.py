"""Checks shared by tests, graders and notebooks: exact and relative comparisons whose failure
messages say *where* and *what* went wrong, and the exercise grader.

Exercises follow Triton-Puzzles: a statement, a stub you fill in, and ``grade(...)`` that runs on the
CPU (Triton's interpreter) and prints either a pass or a message that teaches. A grader never raises
in a notebook, so an unfinished exercise does not stop the rest of the notebook from running.
"""
from __future__ import annotations

import re
from typing import Callable

import torch

__all__ = ["rel_err", "assert_rel_close", "assert_exact", "mismatches", "grade", "Verdict", "explain_exception",
           "PITFALLS"]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN anywhere gives NaN; 0/0 gives 0)."""
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    if o.shape != r.shape:
        raise ValueError(f"shape mismatch: out {tuple(o.shape)} vs ref {tuple(r.shape)}")
    num, den = torch.linalg.vector_norm(o - r), torch.linalg.vector_norm(r)
    if torch.isnan(num):
        return float("nan")
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return float(num / den)


def assert_rel_close(out: torch.Tensor, ref: torch.Tensor, bound: float, name: str = "output") -> float:
    """Assert ||out - ref|| / ||ref|| <= bound; NaN never passes."""
    if torch.isnan(out.detach().float()).any():
        bad = torch.isnan(out.detach().float()).nonzero()[:5].tolist()
        raise AssertionError(f"{name} contains NaN (first at {bad}): an unwritten (poisoned) element or a "
                             "numerical blow-up")
    e = rel_err(out, ref)
    if not e <= bound:
        raise AssertionError(f"{name}: relative error {e:.3e} exceeds the bound {bound:.1e}")
    return e


def mismatches(out: torch.Tensor, ref: torch.Tensor, limit: int = 8) -> tuple[int, list[str]]:
    """Count of positions where out and ref differ bitwise (NaN == NaN), and the first few, described."""
    o, r = out.detach().cpu(), ref.detach().cpu()
    if o.dtype != r.dtype:
        raise AssertionError(f"dtype mismatch: out {o.dtype} vs ref {r.dtype}")
    if o.shape != r.shape:
        raise AssertionError(f"shape mismatch: out {tuple(o.shape)} vs ref {tuple(r.shape)}")
    if o.dtype.is_floating_point:
        of, rf = o.float(), r.float()
        same = (of == rf) | (torch.isnan(of) & torch.isnan(rf))
        if o.dtype.itemsize == 1:  # fp8: compare bytes, +0/-0 and NaN encodings matter for a format
            same = o.view(torch.uint8) == r.view(torch.uint8)
    else:
        same = o == r
    bad = (~same).nonzero()
    desc = []
    for idx in bad[:limit].tolist():
        t = tuple(idx)
        desc.append(f"{list(t)}: got {_fmt(o[t])}, expected {_fmt(r[t])}")
    return int(bad.shape[0]), desc


def _fmt(x: torch.Tensor) -> str:
    if x.dtype.is_floating_point:
        if x.dtype.itemsize == 1:
            return f"{float(x):g} (0x{int(x.view(torch.uint8)):02X})"
        return f"{float(x):g}"
    v = int(x)
    return f"{v} (0x{v & ((1 << (8 * x.dtype.itemsize)) - 1):X})"


def assert_exact(out: torch.Tensor, ref: torch.Tensor, name: str = "output", hint: str = "") -> None:
    """Assert bitwise equality; the message lists the first differing positions."""
    n, desc = mismatches(out, ref)
    if n:
        raise AssertionError(f"{name}: {n} of {ref.numel()} elements differ from the reference"
                             + (f" ({hint})" if hint else "") + ":\n  " + "\n  ".join(desc))


class Verdict:
    """What :func:`grade` returns: truthy on a pass; displays nothing (the grader already printed).

    ``status`` is ``"passed"``, ``"not attempted"``, ``"wrong"`` (the grader's check failed) or
    ``"error"`` (the code raised before it could be checked); ``message`` is what was printed."""

    def __init__(self, passed: bool, status: str = "", message: str = ""):
        self.passed = passed
        self.status = status or ("passed" if passed else "wrong")
        self.message = message

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"Verdict(passed={self.passed}, status={self.status!r})"

    def _ipython_display_(self) -> None:
        pass


# --------------------------------------------------------------------------------------------------
# Errors -> teaching messages. Each entry: (pattern searched in the exception text and the failing
# source line, case-insensitive; the hint). The first match wins, so specific patterns come first.
# The Triton-interpreter entries were seen with Triton 3.9's interpreter (notebook 00 lists them).
# --------------------------------------------------------------------------------------------------

PITFALLS: list[tuple[str, str]] = [
    (r"not implemented for|could not run 'aten::",
     "torch has no kernel for this operation with this dtype on this device (common on the CPU for "
     "float8 and some float16 operations): compute in float32 (.float()) and convert at the end."),
    (r"arange's arguments must be of type tl\.constexpr",
     "tl.arange(0, N) needs N known when the kernel is compiled: declare the block size as "
     "`BLOCK: tl.constexpr` in the kernel's signature and pass it as a keyword (BLOCK=64)."),
    (r"arange's range must be a power of 2|shape element \d+ must be a power of 2",
     "tl.arange(0, N) needs N to be a power of two: round the block up with "
     "triton.next_power_of_2(n) and mask the extra lanes off (m_i = o_i < n)."),
    (r"has unsupported dtype|mask must have boolean",
     "a load/store mask must be a boolean block. In Triton's interpreter, `a & b` of two comparisons "
     "whose operands have different types (an int32 offset against an int64 or float value) can come "
     "out non-boolean: compare values of one type (cast with .to(tl.int32)), or build the mask in one "
     "comparison."),
    (r"make_shape_compatible|incompatible dimensions|must match the size of tensor|shape mismatch|"
     r"shapes? .*(?:not compatible|do not match)|cannot broadcast",
     "two blocks (or tensors) in one expression have shapes that do not match. In a kernel, turn two "
     "1-D offsets into a 2-D tile with o_m[:, None] and o_k[None, :]; on the host, print the .shape of "
     "what you built against the shape the statement asks for."),
    (r"must have dtype|dtype mismatch|expected scalar type|expected .*dtype|found dtype",
     "a tensor has another dtype than the statement (or the kernel) expects: print its .dtype, and "
     "convert with .to(...) where the statement says so."),
    (r"\bdot\b|tl\.dot|matmul|mat1 and mat2",
     "tl.dot needs 2-D blocks with every dimension >= 16 and matching inner sizes. In Triton's "
     "interpreter, tl.dot on bf16 blocks returns garbage: upcast both to tl.float32 first "
     "(.to(tl.float32)); the result is the same on a GPU."),
    (r"float8|fp8|e4m3",
     "Triton's interpreter gets casts to FP8 (.to(tl.float8e4nv)) wrong: a value that rounds up into "
     "the next power of two lands a power of two low, and values past 448 are not saturated; the "
     "workbook's kernels round with workbook.kernels.common.e4m3_rne instead."),
    (r"bfloat16|\bbf16\b",
     "Triton's interpreter truncates fp32 -> bf16 instead of rounding to nearest even and gets bf16 "
     "subnormals wrong on the way to fp32; the workbook's kernels round with "
     "workbook.kernels.common.round_to_bf16 and unpack with bf16_to_fp32."),
    (r"illegal memory access|out of bounds|out of range|index \d+ is out of|segmentation",
     "an index past the end of a buffer. Every tl.load/tl.store whose offsets can pass the end needs "
     "mask=(offsets < n) (and other=... for loads); on the host, check your loop ranges. Without a "
     "mask the interpreter reads whatever memory lies there and a GPU may stop with an illegal "
     "memory access."),
    (r"\bnan\b",
     "a NaN appeared. Graders poison torch.empty buffers with NaN, so a NaN usually means an element "
     "was read before anything wrote it; otherwise look for 0/0, inf - inf or log of a negative."),
    (r"missing \d+ required (?:positional )?argument|takes \d+ positional argument|"
     r"unexpected keyword argument|not callable",
     "the grader calls your function with the arguments the statement names: compare your function's "
     "parameters with the statement (and a kernel's launch with its signature)."),
    (r"'float' object cannot be interpreted as an integer",
     "a launch grid, a block size and a shape must be ints: triton.cdiv(n, BLOCK) stays in integers, "
     "n / BLOCK gives a float."),
    (r"object has no attribute '(?:dtype|type|data_ptr)'|must be a torch\.tensor|pointer argument|"
     r"cannot be accessed from triton|'(?:list|tuple|int|float|numpy\.ndarray)' object has no attribute",
     "a torch tensor was expected and something else came. A kernel's pointer arguments must be "
     "torch tensors on the kernels' device (workbook.DEVICE), and a function the grader calls must "
     "return a tensor: not a list, a NumPy array, a number or None."),
    (r"'NoneType'",
     "a value is None where a tensor or a number is needed: did a function forget to `return`?"),
    (r"triton.*before|TRITON_INTERPRET",
     "restart the Python kernel and run `import workbook` before anything that imports triton."),
]

_GENERIC_HINT = ("read the line above, then run the call by itself in a new cell to see the full "
                 "traceback (or set WORKBOOK_DEBUG=1 to have the grader print it).")


def _chain(e: BaseException) -> list[BaseException]:
    """The exception and its causes, innermost (the original error) first."""
    out, seen = [], set()
    while e is not None and id(e) not in seen:
        out.append(e)
        seen.add(id(e))
        e = e.__cause__  # `raise ... from e`: Triton's InterpreterError wraps the original error so
    return out[::-1]


def _library_dirs() -> tuple[str, ...]:
    import os
    import sysconfig

    here = os.path.dirname(os.path.abspath(__file__))
    dirs = {here}
    try:
        from . import kernels_dir

        dirs.add(str(kernels_dir()))
    except Exception:  # pragma: no cover - the package is installed with its kernels
        pass
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(os.path.abspath(path))
    return tuple(d.rstrip(os.sep) + os.sep for d in dirs)


def _text(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails
        return f"<{type(e).__name__} whose message cannot be printed>"


def _raised_by_a_library(e: BaseException) -> bool:
    """True when the frame that raised ``e`` belongs to Python or an installed library (torch, triton)
    rather than to the learner's code or the workbook."""
    import os
    import sysconfig
    import traceback

    if re.search(r"not implemented for|could not run 'aten::|is not currently (?:implemented|supported)",
                 _text(e), re.IGNORECASE):
        return True   # torch's C++ kernels raise these: no Python frame of theirs in the traceback
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return False
    f = os.path.abspath(tb[-1].filename)
    libs = [os.path.abspath(p) + os.sep for k, p in sysconfig.get_paths().items()
            if k in ("stdlib", "platstdlib", "purelib", "platlib") and p]
    return f.startswith(tuple(libs)) or "site-packages" in f or "dist-packages" in f


def _learner_frame(e: BaseException):
    """The last frame of the innermost exception that is in the learner's code (a notebook cell,
    a script), not in the workbook package, its kernels, Python or an installed library."""
    import os
    import traceback

    lib = _library_dirs()
    for exc in _chain(e):
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not f.filename.startswith("<frozen")
                  and not os.path.abspath(f.filename).startswith(lib)
                  and "site-packages" not in f.filename and "dist-packages" not in f.filename]
        if frames:
            return frames[-1]
    return None


def _where(frame) -> str:
    import re as _re

    if frame is None:
        return ""
    m = _re.search(r"ipykernel_\d+[/\\]", frame.filename)
    place = "a notebook cell" if m else frame.filename
    line = (frame.line or "").strip()
    return f"  where: {place}, line {frame.lineno}, in {frame.name}" + (f":\n      {line}" if line else "")


def explain_exception(e: BaseException) -> tuple[str, str]:
    """``(description, hint)`` for an exception raised by a learner's code: its type and message
    (the original error inside Triton's InterpreterError or CompilationError), where it happened in
    the learner's code, and a hint for the known pitfalls (:data:`PITFALLS`) or a generic one."""
    import re as _re

    chain = _chain(e)
    # the original error, except that a CompilationError (GPU) quotes the kernel line with a caret,
    # which its cause does not: keep the compiler's text then
    inner = next((x for x in reversed(chain) if type(x).__name__.endswith("CompilationError")), chain[0])
    text = str(inner).strip() or repr(inner)
    lines = text.splitlines()
    if len(lines) > 14:  # a CompilationError quotes the kernel: keep its end, where the caret is
        text = "\n".join(["..."] + lines[-14:])
    if len(text) > 2000:
        text = text[:1000] + " ... " + text[-900:]
    kind = type(inner).__name__ if inner is e else f"{type(inner).__name__} (raised as {type(e).__name__})"
    frame = _learner_frame(e)
    haystack = " ".join(str(x) for x in chain) + " " + (frame.line or "" if frame else "")
    hint = next((h for pat, h in PITFALLS if _re.search(pat, haystack, _re.IGNORECASE)), _GENERIC_HINT)
    desc = f"  {kind}: " + text.replace("\n", "\n    ")
    where = _where(frame)
    return desc + ("\n" + where if where else ""), hint


def grade(title: str, check: Callable[[], object]) -> Verdict:
    """Run ``check`` (which raises AssertionError with a teaching message on a wrong answer) and print
    the verdict. Returns a truthy :class:`Verdict` on a pass.

    Never raises (``KeyboardInterrupt`` aside), so an unfinished or broken answer never stops a
    notebook's Run All: ``NotImplementedError`` is "not attempted yet", an ``AssertionError`` is the
    grader's teaching message, and any other exception (a Triton interpreter or compilation error, a
    bad launch, a shape error, ...) is reported with its type, the line of your code it came from and a
    hint (see :data:`PITFALLS`). Set ``WORKBOOK_DEBUG=1`` to also print the full traceback."""
    try:
        check()
    except NotImplementedError as e:
        if _raised_by_a_library(e):  # torch lacking an operation is an error, not a stub
            return _report_error(title, e)
        msg = f"[ ] {title}: not attempted yet (the stub raises NotImplementedError)"
        print(msg)
        return Verdict(False, "not attempted", msg)
    except AssertionError as e:
        text = _text(e) or "the grader's check failed (no message)"
        msg = f"[x] {title}: not yet.\n{text}"
        print(msg)
        return Verdict(False, "wrong", msg)
    except Exception as e:  # noqa: BLE001 - a grader reports every error instead of raising it
        return _report_error(title, e)
    msg = f"[ok] {title}: passed"
    print(msg)
    return Verdict(True, "passed", msg)


def _report_error(title: str, e: BaseException) -> Verdict:
    import os
    import traceback

    try:
        desc, hint = explain_exception(e)
    except Exception as inner:  # the explainer must never be the failure
        desc, hint = f"  {type(e).__name__} (its message could not be shown: {type(inner).__name__})", _GENERIC_HINT
    msg = f"[x] {title}: your code raised an error before it could be checked.\n{desc}\n  Hint: {hint}"
    print(msg)
    if os.environ.get("WORKBOOK_DEBUG", "") not in ("", "0"):
        traceback.print_exception(type(e), e, e.__traceback__)
    return Verdict(False, "error", msg)
