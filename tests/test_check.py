"""grade() turns every way an answer can fail into a printed, teaching message and a falsy Verdict,
and never raises (tests of workbook.check's grader; the comparison helpers are tested by the topics)."""
import ast

import pytest
import torch
import triton
import triton.language as tl

from workbook import DEVICE
from workbook.check import PITFALLS, Verdict, explain_exception, grade


def run(capsys, check):
    v = grade("demo", check)
    out = capsys.readouterr().out
    assert isinstance(v, Verdict)
    return v, out


def raises(exc):
    def check():
        raise exc
    return check


# ---- the three plain outcomes -----------------------------------------------------------------------

def test_pass_not_attempted_and_wrong(capsys):
    v, out = run(capsys, lambda: None)
    assert v and v.status == "passed" and "[ok] demo: passed" in out
    v, out = run(capsys, raises(NotImplementedError()))
    assert not v and v.status == "not attempted" and "not attempted yet" in out
    v, out = run(capsys, raises(AssertionError("row 3 was never written")))
    assert not v and v.status == "wrong" and "not yet" in out and "row 3 was never written" in out
    v, out = run(capsys, raises(AssertionError()))
    assert not v and "no message" in out


# ---- real Triton interpreter errors, from kernels a learner might write ---------------------------

@triton.jit
def arange_not_constexpr(x, n, BLOCK):          # BLOCK lacks tl.constexpr
    o = tl.arange(0, BLOCK)
    tl.store(x + o, o, mask=o < n)


@triton.jit
def arange_not_pow2(x, n, BLOCK: tl.constexpr):
    o = tl.arange(0, 48)
    tl.store(x + o, o, mask=o < n)


@triton.jit
def shapes_do_not_match(x, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    p = tl.arange(0, 2 * BLOCK)
    tl.store(x + o, o + p)


@triton.jit
def mask_not_boolean(x, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(x + o, o, mask=(o < n) & 1)


@triton.jit
def needs_three_args(x, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(x + o, o, mask=o < n)


X = torch.zeros(64, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("launch, error, hint, line", [
    (lambda: arange_not_constexpr[(1,)](X, 64, 64), "arange's arguments must be of type tl.constexpr",
     "BLOCK: tl.constexpr", "o = tl.arange(0, BLOCK)"),
    (lambda: arange_not_pow2[(1,)](X, 64, 64), "power of 2", "triton.next_power_of_2", "tl.arange(0, 48)"),
    (lambda: shapes_do_not_match[(1,)](X, 64, 16), "incompatible dimensions", "o_m[:, None]", "o + p"),
    (lambda: mask_not_boolean[(1,)](X, 64, 64), "Mask must have boolean", "boolean block", "mask=(o < n) & 1"),
    (lambda: needs_three_args[(1,)](X, 64), "missing 1 required", "arguments the statement names", None),
    (lambda: needs_three_args[(64 / 64,)](X, 64, BLOCK=64), "cannot be interpreted as an integer",
     "triton.cdiv(n, BLOCK) stays in integers", None),
    (lambda: needs_three_args[(1,)](X.tolist(), 64, BLOCK=64), "'list' object has no attribute",
     "pointer arguments must be torch tensors", "tl.store(x + o, o, mask=o < n)"),
    (lambda: needs_three_args[(1,)](None, 64, BLOCK=64), "'NoneType' object has no attribute",
     "pointer arguments must be torch tensors", None),
], ids=["arange-not-constexpr", "arange-not-pow2", "shapes", "mask-dtype", "missing-arg", "float-grid",
        "list-as-pointer", "none-as-pointer"])
@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's error texts (a GPU compiles instead)")
def test_interpreter_errors_teach(capsys, launch, error, hint, line):
    v, out = run(capsys, launch)
    assert not v and v.status == "error", out
    assert "raised an error before it could be checked" in out
    assert error in out and "Hint: " + "" in out and hint in out, out
    if line:  # the line of the learner's kernel, found inside the interpreter's wrapped error
        assert "where: " in out and line in out, out


# ---- errors from the host side, a GPU, or the compiler (texts as the libraries write them) --------

@pytest.mark.parametrize("exc, hint", [
    (RuntimeError("The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 0"),
     "shapes that do not match"),
    (ValueError("load: mask has unsupported dtype"), "boolean block"),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), "mask=(offsets < n)"),
    (IndexError("index 70 is out of bounds for dimension 0 with size 64"), "mask=(offsets < n)"),
    (ValueError("cannot convert float NaN to integer"), "read before anything wrote it"),
    (TypeError("x must have dtype in (float16, bfloat16), got float32"), "print its .dtype"),
    (TypeError("silu() takes 1 positional argument but 2 were given"), "arguments the statement names"),
    (AttributeError("'NoneType' object has no attribute 'shape'"), "forget to `return`"),
    (AttributeError("'list' object has no attribute 'to'"), "must return a tensor"),
    (RuntimeError("something nobody anticipated"), "set WORKBOOK_DEBUG=1"),
    (KeyError("BLOCK_M"), "set WORKBOOK_DEBUG=1"),
    (ZeroDivisionError("division by zero"), "set WORKBOOK_DEBUG=1"),
])
def test_other_errors_teach(capsys, exc, hint):
    v, out = run(capsys, raises(exc))
    assert not v and v.status == "error", out
    assert type(exc).__name__ in out and hint in out, out
    assert "where: " in out and "test_check.py" in out, out   # the frame that raised, in "learner" code


def test_the_failing_line_selects_the_pitfall(capsys):
    def kernel_like():  # tl.dot called outside a kernel: the message does not say "dot", the line does
        return tl.dot(torch.ones(16, 16), torch.ones(16, 16))
    v, out = run(capsys, kernel_like)
    assert "upcast both to tl.float32" in out, out


def test_compilation_error_keeps_the_quoted_kernel_line(capsys):
    src = "def k(x):\n    o = tl.arange(0, 48)\n"
    node = ast.parse(src).body[0].body[0]
    try:
        try:
            raise ValueError("arange's range must be a power of 2")
        except ValueError as inner:
            raise triton.compiler.errors.CompilationError(src, node, repr(inner)) from inner
    except Exception as e:
        exc = e
    v, out = run(capsys, raises(exc))
    assert not v and "CompilationError" in out and "tl.arange(0, 48)" in out and "next_power_of_2" in out, out


def test_grade_never_raises_even_when_explaining_fails(capsys):
    class Weird(Exception):
        def __str__(self):
            raise RuntimeError("cannot even print myself")
    v, out = run(capsys, raises(Weird()))
    assert not v and v.status == "error" and "Weird" in out and "Hint: " in out, out


def test_assertion_with_an_unprintable_message_is_still_graded(capsys):
    class WeirdAssert(AssertionError):
        def __str__(self):
            raise RuntimeError("cannot even print myself")
    v, out = run(capsys, raises(WeirdAssert()))
    assert not v and v.status == "wrong" and "cannot be printed" in out, out


def test_a_library_not_implemented_error_is_not_a_stub(capsys):
    v, out = run(capsys, raises(NotImplementedError("\"addmm_impl_cpu_\" not implemented for 'Half'")))
    assert not v and v.status == "error" and "compute in float32" in out, out
    try:
        torch.ones(2, dtype=torch.float8_e4m3fn) * 2
    except NotImplementedError:
        pass
    else:
        pytest.skip("this torch multiplies float8 on the CPU")

    def fp8_multiply_on_cpu():
        x = torch.ones(2, dtype=torch.float8_e4m3fn, device="cpu")
        return x * 2                      # torch has no CPU kernel: NotImplementedError from C++
    v, out = run(capsys, fp8_multiply_on_cpu)
    assert not v and v.status == "error" and "not implemented for" in out and "compute in float32" in out, out


def test_debug_prints_the_full_traceback(capsys, monkeypatch):
    monkeypatch.setenv("WORKBOOK_DEBUG", "1")
    v = grade("demo", raises(RuntimeError("boom")))
    err = capsys.readouterr().err
    assert not v and "Traceback (most recent call last)" in err


def test_keyboard_interrupt_still_stops():
    with pytest.raises(KeyboardInterrupt):
        grade("demo", raises(KeyboardInterrupt()))


def test_explain_exception_and_the_pitfall_table():
    desc, hint = explain_exception(ValueError("arange's range must be a power of 2"))
    assert "ValueError" in desc and "next_power_of_2" in hint
    assert all(isinstance(p, str) and isinstance(h, str) and h for p, h in PITFALLS)
