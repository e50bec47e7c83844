"""Found out of sample (a vector placed on the diagonal of a square matrix): a store whose one index
runs along two strides (``i * (n + 1)``, ``row * n + col`` with ``col = row + k``) writes a diagonal,
and the zeros off it are the result; a row of ``n + 1`` elements (``pid * (n + 1) + tl.arange``) and a
2-D tile (``rows[:, None] * n + cols[None, :]``) are still whole writes."""
import torch
import triton
import triton.language as tl


@triton.jit
def scatter_diagonal_kernel(v, m, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(m + i * (n + 1), tl.load(v + i, mask=i < n), mask=i < n)


def to_diagonal(v, n):
    m = torch.zeros(n, n)
    scatter_diagonal_kernel[(triton.cdiv(n, 128),)](v, m, n, BLOCK=128)
    return m


@triton.jit
def band_kernel(v, m, n, size, k, BLOCK: tl.constexpr):
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if k >= 0:
        row = j
        col = row + k
    else:
        col = j
        row = col - k
    tl.store(m + row * size + col, tl.load(v + j, mask=j < n), mask=(row < size) & (col < size))


def to_offset_diagonal(v, n, k):
    size = n + abs(k)
    m = torch.zeros(size, size)
    band_kernel[(triton.cdiv(n, 128),)](v, m, n, size, k, BLOCK=128)
    return m


@triton.jit
def padded_rows_kernel(x, out, n, BLOCK: tl.constexpr):
    # one program per row of n + 1 elements: the row stride is n + 1, the arange fills the row
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    tl.store(out + r * (n + 1) + c, tl.load(x + c, mask=c < n + 1), mask=c < n + 1)


def padded_rows(x, rows, n):
    out = torch.zeros(rows, n + 1)
    padded_rows_kernel[(rows,)](x, out, n, BLOCK=256)
    return out


@triton.jit
def tile_kernel(x, out, rows, n, BM: tl.constexpr, BN: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    cn = tl.program_id(1) * BN + tl.arange(0, BN)
    ok = (rm[:, None] < rows) & (cn[None, :] < n)
    tl.store(out + rm[:, None] * n + cn[None, :], tl.load(x + rm[:, None] * n + cn[None, :], mask=ok), mask=ok)


def tiled_copy(x, rows, n):
    out = torch.zeros(rows, n)
    tile_kernel[(triton.cdiv(rows, 32), triton.cdiv(n, 32))](x, out, rows, n, BM=32, BN=32)
    return out
