"""Triton kernels launched by the other samples (audited as text, never run)."""
import triton
import triton.language as tl


@triton.jit
def store_rows_kernel(x, out, N, BLOCK: tl.constexpr):
    # program m writes row m of out, every column
    m = tl.program_id(0)
    o = tl.arange(0, BLOCK)
    tl.store(out + m * N + o, tl.load(x + m * N + o, mask=o < N), mask=o < N)


@triton.jit
def scatter_add_kernel(x, idx, out, N, BLOCK: tl.constexpr):
    # a GEMM-like epilogue: each row is added into the row idx[m] of out
    m = tl.program_id(0)
    o = tl.arange(0, BLOCK)
    dst = tl.load(idx + m)
    tl.atomic_add(out + dst * N + o, tl.load(x + m * N + o, mask=o < N), mask=o < N)


@triton.jit
def twice_defined_kernel(x, out, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(out + o, tl.load(x + o))
