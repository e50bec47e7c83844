"""Found out of sample (17th check): a kernel whose helper stores an attention matrix one column block at a
time, for as many blocks as the row block's position allows (a causal band): the blocks past it keep the
zeros, which are returned. Guards that stay whole writes: each program's own rows walked in a loop, and a
persistent loop that strides over every tile by the number of programs."""
import torch
import triton
import triton.language as tl


@triton.jit
def _band_rows(w_ptr, row_block, n, stride, BM: tl.constexpr, BN: tl.constexpr):
    rows = row_block * BM + tl.arange(0, BM)
    cols_end = row_block * BM + BM
    cols = cols_end + tl.arange(0, BN)
    for i in range(cols_end // BN):
        cols -= BN
        tl.store(w_ptr + rows[:, None] * stride + cols[None, :], tl.zeros([BM, BN], tl.float32) + 1.0,
                 mask=(rows < n)[:, None] & (cols < n)[None, :])


@triton.jit
def blocks_in_turn_kernel(w_ptr, n, BM: tl.constexpr, BN: tl.constexpr):
    # the same helper given a loop variable, not the program's position: called (and summarised) first in the
    # file, it must not decide what the helper does for band_kernel below
    for rb in range(tl.cdiv(n, BM)):
        _band_rows(w_ptr + tl.program_id(0) * n * n, rb, n, n, BM, BN)


def weights_by_blocks(heads, n):
    w = torch.full((heads, n, n), 0.0)
    blocks_in_turn_kernel[(heads,)](w, n, BM=64, BN=32)
    return w


@triton.jit
def band_kernel(w_ptr, n, BM: tl.constexpr, BN: tl.constexpr):
    head = tl.program_id(1)
    _band_rows(w_ptr + head * n * n, tl.program_id(0), n, n, BM, BN)


def causal_weights(heads, n):
    w = torch.full((heads, n, n), 0.0)
    band_kernel[(triton.cdiv(n, 64), heads)](w, n, BM=64, BN=32)
    return w


@triton.jit
def own_rows_kernel(x, out, n_rows, n, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    for r in range(pid * ROWS, tl.minimum(pid * ROWS + ROWS, n_rows)):
        tl.store(out + r * n + cols, tl.load(x + r * n + cols, mask=cols < n), mask=cols < n)


def rows_by_program(x, n_rows, n):
    out = torch.zeros(n_rows, n)
    own_rows_kernel[(triton.cdiv(n_rows, 4),)](x, out, n_rows, n, ROWS=4, BLOCK=256)
    return out


@triton.jit
def persistent_kernel(x, out, n_tiles, BLOCK: tl.constexpr, PROGRAMS: tl.constexpr):
    for tile in range(tl.program_id(0), n_tiles, PROGRAMS):
        offs = tile * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs))


def persistent_copy(x, n_tiles):
    out = torch.zeros(n_tiles * 128)
    persistent_kernel[(132,)](x, out, n_tiles, BLOCK=128, PROGRAMS=132)
    return out
