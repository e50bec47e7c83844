"""A kernel that loads and stores every element after the partial writes, written after the 10th
out-of-sample check (vllm-ascend minimax_m3: ``topk_idx = empty(h, n, topk)``, ``topk_idx[..., :k].copy_
(raw)``, then a kernel that loads every slot and stores ``tl.where(valid, idx, -1)`` into every slot, then
``return topk_idx``): the gap was called proven (medium) because the kernel was read as adding into the
buffer. Its stores reach every element, so the gap the return hands on is not proven: low, naming the
kernel (also where the launch is in a function the buffer is passed to). The true counterparts stay
medium: a kernel that adds with atomics, one whose load, add and store are bounded by the partial
write's own bound (launched directly or by a helper), and one whose stores loaded values place."""
import torch
import triton
import triton.language as tl


@triton.jit
def mask_invalid_slots(ti_ptr, lens, topk: tl.constexpr, stride_b, BLOCK_T: tl.constexpr):
    pid_b = tl.program_id(0)
    n_valid = tl.load(lens + pid_b)
    off_t = tl.arange(0, BLOCK_T)
    ptrs = ti_ptr + pid_b * stride_b + off_t
    mask = off_t < topk
    idx = tl.load(ptrs, mask=mask, other=0)
    keep = (off_t < n_valid) & (idx >= 0)
    tl.store(ptrs, tl.where(keep, idx, -1), mask=mask)


def masked_topk(raw, lens, k, topk):
    b = raw.shape[0]
    out = torch.empty(b, topk, dtype=torch.int32, device=raw.device)
    out[:, :k].copy_(raw)
    mask_invalid_slots[(b,)](out, lens, topk, out.stride(0), BLOCK_T=triton.next_power_of_2(topk))
    return out


@triton.jit
def add_atomic(out_ptr, x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def head_then_atomic_add(x, m):
    out = torch.empty(m, dtype=x.dtype, device=x.device)
    out[:4] = x[:4]
    add_atomic[(triton.cdiv(m, 128),)](out, x, m, BLOCK=128)
    return out


@triton.jit
def add_one(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(out_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, v + 1, mask=mask)


def prefix_then_add_over_it(x, n):
    out = torch.empty(64, dtype=x.dtype, device=x.device)
    out[:n] = x[:n]
    add_one[(triton.cdiv(n, 32),)](out, n, BLOCK=32)
    return out


@triton.jit
def add_at_rows(out_ptr, rows, topk: tl.constexpr, BLOCK_T: tl.constexpr):
    row = tl.load(rows + tl.program_id(0))
    off_t = tl.arange(0, BLOCK_T)
    v = tl.load(out_ptr + row * topk + off_t, mask=off_t < topk)
    tl.store(out_ptr + row * topk + off_t, v + 1, mask=off_t < topk)


def head_then_add_at_loaded_rows(raw, rows, k, topk):
    b = raw.shape[0]
    out = torch.empty(b, topk, dtype=raw.dtype, device=raw.device)
    out[:, :k] = raw
    add_at_rows[(b,)](out, rows, topk, BLOCK_T=triton.next_power_of_2(topk))
    return out


def mask_slots_of(idx, lens, topk):
    mask_invalid_slots[(idx.shape[0],)](idx, lens, topk, idx.stride(0), BLOCK_T=triton.next_power_of_2(topk))


def masked_topk_through_a_helper(raw, lens, k, topk):
    b = raw.shape[0]
    out = torch.empty(b, topk, dtype=torch.int32, device=raw.device)
    out[:, :k].copy_(raw)
    mask_slots_of(out, lens, topk)
    return out


def add_one_to(buf, n):
    add_one[(triton.cdiv(n, 32),)](buf, n, BLOCK=32)


def prefix_then_add_through_a_helper(x, n):
    out = torch.empty(64, dtype=x.dtype, device=x.device)
    out[:n] = x[:n]
    add_one_to(out, n)
    return out
