"""Allocations the audit once never saw: in a branch of a conditional expression (``a if c else b``,
a ``.zero_()`` there too) and in a tuple unpacked into names (``a, b = x, y``). Each is judged like
the plain statement; a conditional one at most medium (the other branch is not this allocation),
and one it cannot follow is a low trail-lost finding. Audited as text, never run."""
import torch
import triton
import triton.language as tl


@triton.jit
def copy_rows_kernel(x, out, N, BLOCK: tl.constexpr):
    m = tl.program_id(0)
    o = tl.arange(0, BLOCK)
    tl.store(out + m * N + o, tl.load(x + m * N + o, mask=o < N), mask=o < N)


def out_or_fresh(q, out=None):
    out = torch.zeros_like(q) if out is None else out.zero_()
    copy_rows_kernel[(q.shape[0],)](q, out, q.shape[1], BLOCK=128)
    return out


def fresh_or_given(q, out=None):
    out = torch.zeros_like(q) if out is None else out
    out.copy_(q)
    return out


def conditional_accumulator(q, acc=None):
    acc = torch.zeros_like(q) if acc is None else acc
    acc += q
    return acc


def conditional_empty_half_written(x, n, reuse=None):
    y = torch.empty(2 * n, x.shape[1]) if reuse is None else reuse
    y[:n] = x
    return y


def conditional_fill_not_followed(q, out=None):
    out = torch.zeros_like(q).to(q.device) if out is None else out
    out.copy_(q)
    return out


def unpacked_pair(x, y):
    a, b = torch.zeros_like(x), torch.zeros_like(y)
    a.copy_(x)
    b += y
    return a, b


def unpacked_triple(q, k, v, n):
    dq, dk, dv = torch.zeros_like(q), torch.empty(2 * n, k.shape[1]), torch.zeros_like(v)
    copy_rows_kernel[(q.shape[0],)](q, dq, q.shape[1], BLOCK=128)
    dk[:n] = k
    dv.index_add_(0, torch.arange(v.shape[0]), v)
    return dq, dk, dv


def unpacked_into_a_subscript(x, cache):
    cache[0], b = torch.zeros_like(x), torch.zeros_like(x)
    b.copy_(x)
    return b


def returned_by_a_call(x, split):
    a, b = split(x)
    a.copy_(x)
    return a, b
