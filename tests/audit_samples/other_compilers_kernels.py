"""Kernels of other compilers launched with Triton's ``kernel[grid](...)`` syntax: a numba.cuda kernel
reads its arrays by subscript (no tl.load), so the audit must not read it as a Triton kernel (where an
argument it never tl.loads would look unused). Beside it, a Triton kernel of the same shape, the guard."""
import numba
import torch
import triton
import triton.language as tl
from numba import cuda


@cuda.jit
def mask_bands(x, widths, n):
    i = cuda.grid(1)
    if i < n:
        x[i] = x[i] * widths[i]


@numba.cuda.jit()
def mask_bands_dotted(x, widths, n):
    i = cuda.grid(1)
    if i < n:
        x[i] = widths[i]


@triton.jit
def fill_rows(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, 1.0, mask=offs < n)


def numba_band_mask(x, n):
    widths = torch.zeros(n, device="cuda")      # the numba kernel reads it: its trail is lost there
    mask_bands[(n + 127) // 128, 128](x, widths, n)
    return x


def numba_band_mask_dotted(x, n):
    widths = torch.zeros(n, device="cuda")
    mask_bands_dotted[(n + 127) // 128, 128](x, widths, n)
    return x


def triton_rows(n):
    out = torch.zeros(n, device="cuda")         # the Triton kernel stores every element: redundant fill
    fill_rows[(triton.cdiv(n, 128),)](out, n, BLOCK=128)
    return out
