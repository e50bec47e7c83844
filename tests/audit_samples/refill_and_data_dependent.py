"""Found out of sample: a callee that zero-fills its parameter again makes the caller's fill
redundant; a kernel whose stores a loaded value decides (mask or address) leaves the other elements
as they were, so the zeros may be the result (low); an early return alone is a bounds guard (medium)."""
import torch
import triton
import triton.language as tl


@triton.jit
def mark_kernel(ids, marks, n, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    o = tl.arange(0, BLOCK)
    hit = tl.sum(tl.where(tl.load(ids + o, mask=o < n, other=-1) == i, 1, 0))
    tl.store(marks + i, 1, mask=hit > 0)


@triton.jit
def guarded_copy_kernel(x, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    if i >= n:
        return
    o = tl.arange(0, BLOCK)
    tl.store(out + i * BLOCK + o, tl.load(x + i * BLOCK + o))


def one_hot_rows(ids, out):
    """Marks, per expert, the rows routed to it."""
    out.zero_()
    mark_kernel[(out.shape[0],)](ids, out, ids.numel(), BLOCK=64)
    return out


def caller_fills_first(ids, n):
    out = torch.zeros(n, dtype=torch.int32)
    one_hot_rows(ids, out)
    return out


def marks(ids, n):
    m = torch.zeros(n, dtype=torch.int32)
    mark_kernel[(n,)](ids, m, ids.numel(), BLOCK=64)
    return m


def guarded(x, n):
    out = torch.zeros(n, 64)
    guarded_copy_kernel[(n + 3,)](x, out, n, BLOCK=64)
    return out


@triton.jit
def routed_store_kernel(topk, out, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    e = tl.load(topk + i)
    if e >= 0:
        tl.store(out + i, e)


def routed(topk):
    out = torch.zeros_like(topk)
    routed_store_kernel[(topk.numel(),)](topk, out, BLOCK=1)
    return out


@triton.jit
def lower_blocks_kernel(q, A, BC: tl.constexpr):
    i_i, i_j = tl.program_id(0), tl.program_id(1)
    o = tl.arange(0, BC)
    if i_i > i_j:
        tl.store(A + (i_i * BC + o[:, None]) * 64 + i_j * BC + o[None, :], tl.load(q + o)[:, None])
    elif i_i == i_j:
        tl.store(A + (i_i * BC + o[:, None]) * 64 + i_j * BC + o[None, :], tl.load(q + o)[None, :])


def causal_blocks(q, nb):
    A = torch.zeros(nb * 16, nb * 16)
    lower_blocks_kernel[(nb, nb)](q, A, BC=16)
    return A


def timed_with_flush(cache, fn, iters):
    times = []
    for _ in range(iters):
        cache.zero_()          # evict the L2 cache: the write is the point, not the zeros
        times.append(fn())
        cache.zero_()
    return times


@triton.jit
def row_loss_kernel(x, labels, loss, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    skip = False
    label = tl.load(labels + row)
    if label == ignore_index:
        skip = True                  # a flag set under a test of a loaded value
    if not skip:
        v = tl.load(x + row * BLOCK + tl.arange(0, BLOCK))
        tl.store(loss + row, tl.sum(v, axis=0))


def ignored_rows(x, labels, ignore_index):
    loss = torch.zeros(x.shape[0])   # an ignored row keeps its zero, and the sum reads it
    row_loss_kernel[(x.shape[0],)](x, labels, loss, ignore_index, BLOCK=x.shape[1])
    return loss.sum()
