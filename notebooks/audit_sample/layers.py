"""Launchers and layers of the sample engine. Some zero fills are redundant, some are not."""
import torch
import triton

from .buffers import new_output
from .kernels import histogram_kernel, row_amax_kernel, scale_rows_kernel

GROUP = 4  # the consumer reads scales in whole groups of GROUP rows (like a GEMM reading whole tiles)


def scale_rows(x, s):
    """out[m, :] = x[m, :] * s[m]"""
    M, N = x.shape
    out = torch.zeros_like(x)
    scale_rows_kernel[(M,)](x, s, out, N, BLOCK_N=triton.next_power_of_2(N))
    return out


def scale_rows_helper(x, s):
    """The same, with the buffer from an allocation helper in another file."""
    M, N = x.shape
    out = new_output(x)
    scale_rows_kernel[(M,)](x, s, out, N, BLOCK_N=triton.next_power_of_2(N))
    return out


def row_scales(x, out=None):
    """Per-row amax of x into a buffer padded to a multiple of GROUP rows."""
    M, N = x.shape
    if out is None:
        out = torch.zeros(triton.cdiv(M, GROUP) * GROUP, dtype=torch.float32, device=x.device)
    row_amax_kernel[(M,)](x, out, N, BLOCK_N=triton.next_power_of_2(N))
    return out


def group_scales(scales):
    """The consumer: the largest scale of each group of GROUP rows, padding rows included."""
    return scales.view(-1, GROUP).amax(dim=1)


def gate_into(z, z_out):
    """Write sigmoid(z) into the caller's buffer."""
    z_out.zero_()
    z_out[:] = torch.sigmoid(z)
    return z_out


def token_histogram(ids, num_experts, counts=None):
    """How many tokens go to each expert."""
    if counts is None:
        counts = torch.zeros(num_experts, dtype=torch.int32, device=ids.device)
    T = ids.numel()
    histogram_kernel[(triton.cdiv(T, 64),)](ids, counts, T, BLOCK=64)
    return counts


def expert_sums(x, expert_ids, num_experts):
    """Sum of the token rows routed to each expert."""
    acc = torch.zeros(num_experts, x.shape[1], dtype=x.dtype, device=x.device)
    acc.index_add_(0, expert_ids, x)
    return acc


def project_tokens(x, w, num_tokens):
    """x is a padded batch (rows past num_tokens are padding); only the real tokens are projected."""
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    out[:num_tokens] = x[:num_tokens] @ w
    return out
