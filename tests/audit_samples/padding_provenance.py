"""Class 4: the padding of an allocation is where its size came from, lines before."""
import torch

from .sample_kernels import store_rows_kernel


def round_up(n, m):
    return (n + m - 1) // m * m


def scales_by_helper(x):
    rows = round_up(x.shape[0], 128)
    scales = torch.zeros(rows, x.shape[1])
    store_rows_kernel[(x.shape[0],)](x, scales, x.shape[1], BLOCK=16)
    return scales


def scales_by_arithmetic(x):
    n = x.shape[0]
    rows = (n + 127) // 128 * 128
    total = rows
    scales = torch.zeros(total, x.shape[1])
    store_rows_kernel[(n,)](x, scales, x.shape[1], BLOCK=16)
    return scales


def not_padded(x):
    rows = x.shape[0]
    scales = torch.zeros(rows, x.shape[1])
    store_rows_kernel[(rows,)](x, scales, x.shape[1], BLOCK=16)
    return scales
