"""Found out of sample (a per-dimension offset table): a column offset ``pid_n + tl.arange(0, BN)``
where the tile is ``pid_n * BN + tl.arange(0, BN)`` makes the programs' columns overlap, and once the
row is longer than one block its tail is never stored: the zeros there are read. The tile with the
block offset, and a grid-stride loop, write every element."""
import torch
import triton
import triton.language as tl


@triton.jit
def offsets_kernel(idx, out, rows, n, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)[:, None]
    cn = pid_n + tl.arange(0, BN)[None, :]
    ok = (rm < rows) & (cn < n)
    tl.store(out + rm * n + cn, tl.load(idx + rm * n + cn, mask=ok) % 7, mask=ok)


def dim_offsets(idx, rows, n):
    out = torch.zeros(rows, n, dtype=torch.int32)
    offsets_kernel[(triton.cdiv(rows, 16), triton.cdiv(n, 64))](idx, out, rows, n, BM=16, BN=64)
    return out


@triton.jit
def offsets_fixed_kernel(idx, out, rows, n, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)[:, None]
    cn = pid_n * BN + tl.arange(0, BN)[None, :]
    ok = (rm < rows) & (cn < n)
    tl.store(out + rm * n + cn, tl.load(idx + rm * n + cn, mask=ok) % 7, mask=ok)


def dim_offsets_fixed(idx, rows, n):
    out = torch.zeros(rows, n, dtype=torch.int32)
    offsets_fixed_kernel[(triton.cdiv(rows, 16), triton.cdiv(n, 64))](idx, out, rows, n, BM=16, BN=64)
    return out


@triton.jit
def block_copy_kernel(x, out, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + o, tl.load(x + o, mask=o < n), mask=o < n)


def block_copy(x, n):
    out = torch.zeros(n)
    block_copy_kernel[(triton.cdiv(n, 256),)](x, out, n, BLOCK=256)
    return out


@triton.jit
def strided_copy_kernel(x, out, n, BLOCK: tl.constexpr):
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        o = start + tl.arange(0, BLOCK)
        tl.store(out + o, tl.load(x + o, mask=o < n), mask=o < n)


def grid_stride_copy(x, n):
    out = torch.zeros(n)
    strided_copy_kernel[(132,)](x, out, n, BLOCK=256)
    return out
