"""A third kernel file: a name also defined in sample_kernels_b.py, with the same semantics."""
import triton
import triton.language as tl


@triton.jit
def agreeing_kernel(x, out, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(out + o, tl.load(x + o) + 1)
