"""Device code of the sample engine (Triton; runs in the interpreter without a GPU)."""
import triton
import triton.language as tl


@triton.jit
def scale_rows_kernel(x, s, out, N, BLOCK_N: tl.constexpr):
    # program m writes row m of out: every column, masked at N
    m = tl.program_id(0)
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < N
    b_x = tl.load(x + m * N + o_n, mask=m_n)
    b_s = tl.load(s + m)
    tl.store(out + m * N + o_n, b_x * b_s, mask=m_n)


@triton.jit
def row_amax_kernel(x, scales, N, BLOCK_N: tl.constexpr):
    # program m writes scales[m] for the M real rows; the padded rows are left alone
    m = tl.program_id(0)
    o_n = tl.arange(0, BLOCK_N)
    b_x = tl.load(x + m * N + o_n, mask=o_n < N, other=0.0)
    tl.store(scales + m, tl.max(tl.abs(b_x), axis=0))


@triton.jit
def histogram_kernel(ids, counts, T, BLOCK: tl.constexpr):
    # every program adds its tokens into counts: the buffer must start at zero
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < T
    b_id = tl.load(ids + o, mask=m, other=0)
    tl.atomic_add(counts + b_id, 1, mask=m)
