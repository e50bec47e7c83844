"""Launches with a *starred argument before the buffers: the parameter a later positional argument
lands on is known only when the star's length is (a literal tuple, the strides of a tensor whose
number of dimensions the function shows); otherwise the trail is lost there (low), never mapped to
the wrong parameter. Keywords still map by name."""
import torch
import triton
import triton.language as tl


@triton.jit
def rows_and_sums_kernel(x, stride_x, stride_o, out, sums, N, BLOCK: tl.constexpr):
    # out: row m stored once (store only); sums: added into (needs its zeros)
    m = tl.program_id(0)
    o = tl.arange(0, BLOCK)
    v = tl.load(x + m * stride_x + o, mask=o < N)
    tl.store(out + m * stride_o + o, v, mask=o < N)
    tl.atomic_add(sums + o, v, mask=o < N)


@triton.jit
def matrix_copy_kernel(x, sxm, sxn, out, som, son, N, BLOCK: tl.constexpr):
    m = tl.program_id(0)
    o = tl.arange(0, BLOCK)
    tl.store(out + m * som + o * son, tl.load(x + m * sxm + o * sxn, mask=o < N), mask=o < N)


def strides_of_unknown_length(x, strides):
    # `strides` comes from the caller: out and sums cannot be told apart from the strides
    out = torch.zeros_like(x)
    sums = torch.zeros(x.shape[1], device=x.device)
    rows_and_sums_kernel[(x.shape[0],)](x, *strides, out, sums, x.shape[1], BLOCK=128)
    return out, sums


def strides_in_a_literal(x):
    strides = (x.stride(0), x.stride(0))
    out = torch.zeros_like(x)
    sums = torch.zeros(x.shape[1], device=x.device)
    rows_and_sums_kernel[(x.shape[0],)](x, *strides, out, sums, x.shape[1], BLOCK=128)
    return out, sums


def strides_of_a_shown_matrix(x):
    m, n = x.shape
    out = torch.zeros(m, n, device=x.device)
    matrix_copy_kernel[(m,)](x, *x.stride(), out, *out.stride(), n, BLOCK=128)
    return out


def strides_of_an_unshown_tensor(x):
    out = torch.zeros_like(x)
    matrix_copy_kernel[(x.shape[0],)](x, *x.stride(), out, *out.stride(), x.shape[-1], BLOCK=128)
    return out


def keywords_after_a_star(x, strides):
    out = torch.zeros_like(x)
    sums = torch.zeros(x.shape[1], device=x.device)
    rows_and_sums_kernel[(x.shape[0],)](x, *strides, out=out, sums=sums, N=x.shape[1], BLOCK=128)
    return out, sums


def _write_into(x, rows, cols, out):
    out.copy_(x)


def helper_after_a_star(x, shape):
    out = torch.zeros_like(x)
    _write_into(x, *shape, out)
    return out
