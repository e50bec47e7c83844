"""Writes through an index tensor or a mask (advanced indexing), written after the 9th out-of-sample
check: ``kperm = empty(64)`` then ``kperm[tau64] = s`` with ``tau64`` a permutation of 0..63 writes every
element, yet was reported as "[0, 64) never written" (medium). An index that is not a slice nor a
constant may be a tensor, so the write may cover any part: no proven gap (low, naming the write), and no
proof of a whole write either (a zero fill stays necessary). The slice and constant-index gaps at the
end must stay medium."""
import torch


def inverse_permutation(device):
    s = torch.arange(64, device=device)
    tau = 32 * (s // 32) + (s % 32)
    kperm = torch.empty(64, dtype=torch.long, device=device)
    kperm[tau] = s
    return kperm.to(torch.int32)


def rows_picked_by_an_index(x, idx):
    out = torch.empty(16, x.shape[1], dtype=x.dtype)
    out[idx, :] = x
    return out


def prefix_then_a_mask(x, n, mask):
    out = torch.empty(64, x.shape[1], dtype=x.dtype)
    out[:n] = x[:n]
    out[mask] = 0
    return out


def head_then_index_copy(x, idx):
    out = torch.empty(64, x.shape[1], dtype=x.dtype)
    out[:4] = x[:4]
    out.index_copy_(0, idx, x)
    return out


def head_then_scatter(x, idx):
    out = torch.empty(64, x.shape[1], dtype=x.dtype)
    out[:4] = x[:4]
    out.scatter_(0, idx, x)
    return out


def zeros_then_a_permutation(s, tau):
    kperm = torch.zeros(64, dtype=torch.long)
    kperm[tau] = s
    return kperm


def prefix_of_a_fixed_buffer(x, n):
    out = torch.empty(64, x.shape[1], dtype=x.dtype)
    out[:n] = x[:n]
    return out


def two_constant_rows(x):
    out = torch.empty(3, x.shape[1], dtype=x.dtype)
    out[0] = x[0]
    out[1] = x[1]
    return out
