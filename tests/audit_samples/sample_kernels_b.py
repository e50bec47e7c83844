"""A second kernel file: one name defined again, with other semantics (audited as text, never run)."""
import triton
import triton.language as tl


@triton.jit
def twice_defined_kernel(x, out, BLOCK: tl.constexpr):
    # this one accumulates
    o = tl.arange(0, BLOCK)
    tl.atomic_add(out + o, tl.load(x + o))


@triton.jit
def agreeing_kernel(x, out, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(out + o, tl.load(x + o) * 2)
