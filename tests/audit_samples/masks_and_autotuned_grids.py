"""Found out of sample (a band scatter, an autotuned grid): a store mask with a term that picks among
in-bounds elements (``k >= 0``) writes a part the kernel chooses, not the whole buffer; a grid sized
by the launch config while the store writes one element per program writes as many elements as the
config gives programs; a kernel whose autotune resets a buffer to zero relies on the zeros."""
import torch
import triton
import triton.language as tl


@triton.jit
def band_scatter_kernel(w, dense, n, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    # row r gets WIDTH values, in the columns r - WIDTH // 2 ... r + WIDTH // 2 that exist
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row_ok = r < n
    for j in range(WIDTH):
        col = r + j - WIDTH // 2
        ok = row_ok & (col >= 0) & (col < n)
        tl.store(dense + r * n + col, tl.load(w + r * WIDTH + j, mask=row_ok), mask=ok)


@triton.jit
def bounded_rows_kernel(x, out, n, BLOCK: tl.constexpr):
    # the plain bounds guard: every in-bounds element is written
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = o < n
    tl.store(out + o, tl.load(x + o, mask=ok), mask=ok)


def band_to_dense(w, n):
    dense = torch.zeros(n, n)
    band_scatter_kernel[(triton.cdiv(n, 32),)](w, dense, n, WIDTH=5, BLOCK=32)
    return dense


def bounded(x, n):
    out = torch.zeros(n)
    bounded_rows_kernel[(triton.cdiv(n, 32),)](x, out, n, BLOCK=32)
    return out


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (256, 512)], key=["n"])
@triton.jit
def block_sums_kernel(x, partial, total, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    s = tl.sum(tl.load(x + o, mask=o < n, other=0.0))
    tl.store(partial + tl.program_id(0), s)          # one slot per program
    tl.store(total + o, tl.load(x + o, mask=o < n), mask=o < n)


def block_sums(x, n):
    partial = torch.zeros(triton.cdiv(n, 128))      # sized for the smallest block the author had in mind
    copy = torch.zeros(n)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
    block_sums_kernel[grid](x, partial, copy, n)
    return partial.sum(), copy


def block_sums_fixed(x, n):
    partial = torch.zeros(triton.cdiv(n, 256))
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
    block_sums_kernel[grid](x, partial, torch.empty(n), n, BLOCK=256)
    return partial


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (256, 512)], key=["n"], reset_to_zero=["slots"])
@triton.jit
def slot_kernel(x, slots, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(slots + tl.program_id(0), tl.sum(tl.load(x + o, mask=o < n, other=0.0)))


def slot_sums(x, n):
    slots = torch.zeros(64)
    slot_kernel[(triton.cdiv(n, 512),)](x, slots, n)
    return slots.sum()
