"""Found out of sample (a prefix sum whose kernel writes counts[1..n], a histogram stored one column
in): a store whose address starts past index 0 (a loop from 1, ``1 + tl.arange``, a base moved by one
stride) never writes index 0, so the zero there is what the consumer reads; a kernel that also
stores index 0 itself still writes the whole buffer."""
import torch
import triton
import triton.language as tl


@triton.jit
def running_total_kernel(sizes, starts, n: tl.constexpr):
    # starts[i + 1] = sizes[0] + ... + sizes[i]; starts[0] is left alone
    total = 0
    for i in range(1, n + 1):
        total += tl.load(sizes + i - 1)
        tl.store(starts + i, total)


def segment_starts(sizes, n):
    starts = torch.zeros(n + 1, dtype=torch.int32)
    running_total_kernel[(1,)](sizes, starts, n)
    return starts


@triton.jit
def shifted_scan_kernel(x, out, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    v = tl.cumsum(tl.load(x + o, mask=o < n, other=0), axis=0)
    tl.store(out + 1 + o, v, mask=o < n)


def exclusive_scan(x, n):
    out = torch.zeros(n + 1)
    shifted_scan_kernel[(1,)](x, out, n, BLOCK=1024)
    return out


@triton.jit
def row_counts_kernel(x, y, n, stride_row, stride_col, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    y = y + r * stride_row + stride_col          # one column in: column 0 stays as it was
    c = tl.arange(0, BLOCK)
    tl.store(y + c * stride_col, tl.load(x + r * n + c, mask=c < n), mask=c < n)


def row_counts(x, rows, n):
    y = torch.zeros(rows, n + 1)
    row_counts_kernel[(rows,)](x, y, n, y.stride(0), y.stride(1), BLOCK=256)
    return y


@triton.jit
def scan_with_head_kernel(x, out, n, BLOCK: tl.constexpr):
    # the same shifted store, and index 0 stored too: every element written
    o = tl.arange(0, BLOCK)
    tl.store(out, 0.0)
    tl.store(out + o + 1, tl.cumsum(tl.load(x + o, mask=o < n, other=0), axis=0), mask=o < n)


def exclusive_scan_with_head(x, n):
    out = torch.zeros(n + 1)
    scan_with_head_kernel[(1,)](x, out, n, BLOCK=1024)
    return out
