"""Class 3: a launch after a return/raise/continue/break never runs: it is not the writer."""
import torch

from .sample_kernels import store_rows_kernel


def token_sums(x, topk):
    out = torch.zeros(x.shape[0] // topk, x.shape[1])
    return x.view(-1, topk, x.shape[1]).sum(dim=1)
    store_rows_kernel[(1,)](x, out, x.shape[1], BLOCK=16)   # left behind by a refactor


def guarded_sum(x):
    acc = torch.zeros_like(x)
    if x.dtype == torch.float64:
        raise TypeError("float64 is not supported")
        store_rows_kernel[(1,)](x, acc, x.shape[1], BLOCK=16)
    acc.add_(x)
    return acc


def reachable(x):
    out = torch.zeros_like(x)
    if x.numel() == 0:
        return x
    store_rows_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=16)
    return out


def else_branch_returns(x, copy):
    if copy:                                  # an exit in the other branch leaves this one reachable
        out = torch.zeros_like(x)
        out.copy_(x)
        return out
    else:
        return None


def branch_returns_first(x, on_cpu):
    if on_cpu:                                # this path ends at its return: the launch below is not its writer
        out = torch.zeros(x.shape[0] + 1, x.shape[1])
        out[: x.shape[0]] = x
        return out
    out = torch.empty_like(x)
    store_rows_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=16)
    return out
