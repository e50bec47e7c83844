"""Found out of sample (9th check: e8m0 scales in super-blocks of 32 rows, pre-zeroed on purpose): a
buffer whose row count is rounded up (a count of 32-row blocks, or the rows rounded up to a multiple
of 32, however it is written) and a kernel launched over the real rows only: the padding rows are
never stored and keep their zeros. The same buffer written by a launch whose grid covers the padded
rows (the kernel stores zeros into the padding itself) is still written whole."""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def row_scale_kernel(x, s, M, N, BLOCK_N: tl.constexpr):
    # program m stores the scale of row m; a row past M (padding) stores 0
    m = tl.program_id(0)
    o = tl.arange(0, BLOCK_N)
    v = tl.load(x + m * N + o, mask=(o < N) & (m < M), other=0.0)
    tl.store(s + m, tl.max(tl.abs(v), axis=0))


def scales_in_super_blocks(x):
    M, N = x.shape
    n_super = (M + 31) // 32                  # 32 rows per super-block, the last one padded
    s = torch.zeros((n_super, 32), dtype=torch.float32)
    row_scale_kernel[(M,)](x, s, M, N, BLOCK_N=triton.next_power_of_2(N))
    return s


def scales_rounded_by_cdiv(x):
    M, N = x.shape
    shape = (triton.cdiv(M, 32) * 32,)
    s = torch.zeros(shape, dtype=torch.float32)
    row_scale_kernel[(M,)](x, s, M, N, BLOCK_N=triton.next_power_of_2(N))
    return s


def scales_rounded_by_negation(x):
    M, N = x.shape
    rows = -(-M // 32) * 32
    s = torch.zeros(rows, dtype=torch.float32)
    grid = (M,)
    row_scale_kernel[grid](x, s, M, N, BLOCK_N=triton.next_power_of_2(N))
    return s


def scales_rounded_by_ceil(x):
    M, N = x.shape
    s = torch.zeros(math.ceil(M / 32) * 32, dtype=torch.float32)
    row_scale_kernel[(M,)](x, s, M, N, BLOCK_N=triton.next_power_of_2(N))
    return s


def scales_padding_written(x):
    # the true counterpart: the grid runs over the padded rows, and the kernel stores 0 there
    M, N = x.shape
    rows = (M + 31) // 32 * 32
    s = torch.zeros(rows, dtype=torch.float32)
    row_scale_kernel[(rows,)](x, s, M, N, BLOCK_N=triton.next_power_of_2(N))
    return s


def scales_padding_written_by_blocks(x):
    # the true counterpart with a count of blocks: one program per block of the rounded count
    M, N = x.shape
    n_super = triton.cdiv(M, 32)
    s = torch.zeros((n_super, 32), dtype=torch.float32)
    row_scale_kernel[(triton.cdiv(M, 32) * 32,)](x, s, M, N, BLOCK_N=triton.next_power_of_2(N))
    return s
